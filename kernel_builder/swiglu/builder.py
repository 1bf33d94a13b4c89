"""SwiGLU: y = silu(gate) * up = gate * sigmoid(gate) * up   (f32 math, bf16 RNE out).

MLIR + external C++ (kernel_builder.swiglu.external.swiglu_kernel). launch -> segment -> herd [herd, 1]. The operands
are read as 1-D `rows*dim` elements; tile t owns a contiguous range and moves `chunk` elements per step: gate
and up DMA'd L3 -> L1 (allocated in the loop: ping-ponged), one call into `y_l1` (allocated once: the call
writes it), y stored. Offsets are affine in the tile id and the loop iv (no div/rem); three L3 streams per tile
(at most 8 tiles in the shim budget).
"""
from __future__ import annotations

from kernel_builder.emit import L1, Module, attr_dict, herd, launch, memref, segment
from kernel_builder.swiglu.external import swiglu_kernel
from kernel_builder.swiglu.plan import plan_swiglu

KIND = "swiglu"


def build(rows: int, dim: int) -> str:

    plan = plan_swiglu(rows, dim)
    n = plan.chunk_elements
    ext = swiglu_kernel(n)
    ty = memref([rows, dim])
    l1_ty = memref([n], "bf16", L1)
    mod = Module(KIND, [ty, ty, ty])
    mod.declare(ext.symbol, ext.obj, [l1_ty, l1_ty, l1_ty])
    types = [ty, ty, ty]

    la = launch(mod.body, [1, 1], list(zip(mod.args, types)), [attr_dict(KIND, {"rows": rows, "dim": dim})])
    seg = segment(la.body, "swiglu_seg", list(zip(la.args, types)))
    h = herd(seg.body, "swiglu_herd", (plan.herd, 1), list(zip(seg.args, types)), [f'link_with = "{ext.obj}"'])
    b = h.body
    gate, up, y = h.args

    yl = b.alloc("y_l1", l1_ty)
    if plan.steps > 1:
        b.pin_to_scope(yl, l1_ty)  # written by the call: one copy, outside the ping-ponged loop
    first = b.muli(h.ids[0], plan.units_per_tile)
    loop, i = b.for_(0, plan.units_per_tile, n, "e") if plan.steps > 1 else (b, 0)
    off = loop.addi(first, i) if plan.steps > 1 else first
    gl, ul = loop.alloc("gate_l1", l1_ty), loop.alloc("up_l1", l1_ty)
    loop.dma(gl, l1_ty, None, gate, ty, ([off], [n], [1]))
    loop.dma(ul, l1_ty, None, up, ty, ([off], [n], [1]))
    loop.call(ext.symbol, [(gl, l1_ty), (ul, l1_ty), (yl, l1_ty)])
    loop.dma(y, ty, ([off], [n], [1]), yl, l1_ty, None)
    loop.dealloc(gl, l1_ty)
    loop.dealloc(ul, l1_ty)
    b.dealloc(yl, l1_ty)
    return mod.text()
