"""SwiGLU: y = silu(gate) * up = gate * sigmoid(gate) * up   (f32 math, bf16 RNE out).

MLIR + external C++ (kernel_builder.swiglu.external.swiglu_kernel). launch -> segment -> herd [herd, 1]. The operands
are read as 1-D `rows*dim` elements; tile t owns a contiguous range and moves `chunk` elements per step: gate
and up DMA'd L3 -> L1 (allocated in the loop: ping-ponged), one call into `y_l1` (allocated once: the call
writes it), y stored. Offsets are affine in the tile id and the loop iv (no div/rem); three L3 streams per tile
(at most 8 tiles in the shim budget).

With `pairs` (8): gate and up are the (gate, up) 8-element pairs of ONE [rows, 2*dim] input (the output of a
projection by the gate/up weight interleaved by 8 rows, kernel_builder/gemm_swiglu/layout.py) passed as both
operands: the gate DMA reads its even 8-element blocks, the up DMA its odd ones (16-byte runs 32 bytes apart);
the C++ kernel is the same.
"""
from __future__ import annotations

from kernel_builder.emit import L1, Module, attr_dict, gated_unit_module, herd, launch, memref, segment
from kernel_builder.swiglu.external import swiglu_kernel
from kernel_builder.swiglu.plan import plan_swiglu

KIND = "swiglu"


def build(rows: int, dim: int, pairs: int = 0) -> str:
    plan = plan_swiglu(rows, dim)
    if not pairs:
        return gated_unit_module(KIND, rows, dim, plan, swiglu_kernel(plan.chunk_elements))
    return _pairs_module(rows, dim, pairs, plan, swiglu_kernel(plan.chunk_elements))


def _pairs_module(rows: int, dim: int, pairs: int, plan, ext) -> str:
    """gate = blocks 2q, up = blocks 2q + 1 (of `pairs` elements) of the [rows, 2*dim] input; y [rows, dim]."""
    n = plan.chunk_elements
    if n % pairs or plan.units_per_tile % pairs:
        raise ValueError(f"swiglu: chunk {n} is not a multiple of the pair block {pairs}")
    in_ty, out_ty, l1_ty = memref([rows, 2 * dim]), memref([rows, dim]), memref([n], "bf16", L1)
    types = [in_ty, in_ty, out_ty]
    mod = Module(KIND, types)
    mod.declare(ext.symbol, ext.obj, [l1_ty, l1_ty, l1_ty])
    la = launch(mod.body, [1, 1], list(zip(mod.args, types)),
                [attr_dict(KIND, {"rows": rows, "dim": dim, "pairs": pairs})])
    seg = segment(la.body, f"{KIND}_seg", list(zip(la.args, types)))
    h = herd(seg.body, f"{KIND}_herd", (plan.herd, 1), list(zip(seg.args, types)), [f'link_with = "{ext.obj}"'])
    b = h.body
    x0, x1, y = h.args
    yl = b.alloc("y_l1", l1_ty)
    if plan.steps > 1:
        b.pin_to_scope(yl, l1_ty)  # written by the call: one copy, outside the ping-ponged loop
    first = b.muli(h.ids[0], plan.units_per_tile // pairs)          # in pair blocks
    loop, i = b.for_(0, plan.units_per_tile // pairs, n // pairs, "e") if plan.steps > 1 else (b, 0)
    blk = loop.addi(first, i) if plan.steps > 1 else first
    off = loop.muli(blk, pairs)                                       # in output elements
    gl, ul = loop.alloc("gate_l1", l1_ty), loop.alloc("up_l1", l1_ty)
    loop.dma(gl, l1_ty, None, x0, in_ty, ([blk, 0], [n // pairs, pairs], [2 * pairs, 1]))
    loop.dma(ul, l1_ty, None, x1, in_ty, ([blk, pairs], [n // pairs, pairs], [2 * pairs, 1]))
    loop.call(ext.symbol, [(gl, l1_ty), (ul, l1_ty), (yl, l1_ty)])
    loop.dma(y, out_ty, ([off], [n], [1]), yl, l1_ty, None)
    loop.dealloc(gl, l1_ty)
    loop.dealloc(ul, l1_ty)
    b.dealloc(yl, l1_ty)
    return mod.text()
