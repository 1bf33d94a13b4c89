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
from kernel_builder.emit import L1, Module, attr_dict, elementwise_body, herd, memref

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
    elementwise_body(h, plan, ext.symbol, l1_ty, ("a", "b"), in_ty, out_ty)
    return mod.text()
