"""Elementwise add: y = a + b (bf16 in/out, f32 add, RNE).

MLIR + external C++ (kernel_builder.add.external.add_kernel, AIE2P vector path). Emits a bare `air.herd` (the
stitcher wraps it). The operands are read as 1-D `rows*dim` elements; tile t of the [herd, 1] herd owns a
contiguous range and moves `chunk` elements per step: a and b DMA'd L3 -> L1 (allocated in the loop, so aircc's
ping-pong transform doubles them), one call into `y_l1` (allocated once: the call writes it), y stored. Offsets
are affine in the tile id and the loop iv (no div/rem); three L3 streams per tile, so at most 8 tiles fit the
16 + 16 shim channels. `flat_out=True` declares y as a flat [rows*dim] buffer (for consumers that take the
1-D view); the access pattern is the same.
"""
from __future__ import annotations

from kernel_builder.add.external import add_kernel
from kernel_builder.add.plan import plan_add
from kernel_builder.emit import L1, Module, attr_dict, herd, memref

KIND = "add"


def build(rows: int, dim: int, flat_out: bool = False) -> str:

    plan = plan_add(rows, dim)
    n = plan.chunk_elements
    ext = add_kernel(n)
    in_ty = memref([rows, dim])
    out_ty = memref([rows * dim]) if flat_out else in_ty
    l1_ty = memref([n], "bf16", L1)
    mod = Module(KIND, [in_ty, in_ty, out_ty])
    mod.declare(ext.symbol, ext.obj, [l1_ty, l1_ty, l1_ty])
    attrs = [attr_dict(KIND, {"rows": rows, "dim": dim, "flat_out": bool(flat_out)}), f'link_with = "{ext.obj}"']
    h = herd(mod.body, "add_herd", (plan.herd, 1),
             [(mod.args[0], in_ty), (mod.args[1], in_ty), (mod.args[2], out_ty)], attrs)
    b = h.body
    a, bb, y = h.args

    yl = b.alloc("y_l1", l1_ty)
    if plan.steps > 1:
        b.pin_to_scope(yl, l1_ty)  # written by the call: one copy, outside the ping-ponged loop
    first = b.muli(h.ids[0], plan.units_per_tile)
    loop, i = b.for_(0, plan.units_per_tile, n, "e") if plan.steps > 1 else (b, 0)
    off = loop.addi(first, i) if plan.steps > 1 else first
    al, bl = loop.alloc("a_l1", l1_ty), loop.alloc("b_l1", l1_ty)
    loop.dma(al, l1_ty, None, a, in_ty, ([off], [n], [1]))
    loop.dma(bl, l1_ty, None, bb, in_ty, ([off], [n], [1]))
    loop.call(ext.symbol, [(al, l1_ty), (bl, l1_ty), (yl, l1_ty)])
    loop.dma(y, out_ty, ([off], [n], [1]), yl, l1_ty, None)
    loop.dealloc(al, l1_ty)
    loop.dealloc(bl, l1_ty)
    b.dealloc(yl, l1_ty)
    return mod.text()
