"""Elementwise add: y = a + b (bf16 in/out, f32 add, RNE).

MLIR-only (codegen, linalg.generic on L1 chunks). Emits a bare `air.herd` (the stitcher wraps it). The data
is processed as `rows*dim/chunk` chunks of `chunk` elements (chunk divides dim, so a chunk never crosses a
row); each tile takes a contiguous range of chunks. `flat_out=True` writes y as a flat [rows*dim] buffer
(for chaining into consumers that take a 1-D view) using the flat element offset directly.
"""
from __future__ import annotations

from .. import planner
from ._emit import L1, Module, attr_dict, herd, memref

KIND = "add"
_MAP1 = "affine_map<(d0) -> (d0)>"


def build(rows: int, dim: int, flat_out: bool = False) -> str:
    plan = planner.plan_add(rows, dim)
    in_ty = memref([rows, dim])
    out_ty = memref([rows * dim]) if flat_out else in_ty
    mod = Module(KIND, [in_ty, in_ty, out_ty])
    attrs = [attr_dict(KIND, {"rows": rows, "dim": dim, "flat_out": bool(flat_out)})]
    h = herd(mod.body, "add_herd", (plan.herd, 1),
             [(mod.args[0], in_ty), (mod.args[1], in_ty), (mod.args[2], out_ty)], attrs)
    b = h.body
    a, bb, y = h.args
    chunk = plan.chunk
    l1_ty = memref([chunk], "bf16", L1)

    first = b.muli(h.ids[0], plan.units_per_tile)
    loop, i = b.for_(0, plan.units_per_tile, 1, "c")
    g = loop.addi(first, i)
    off = loop.muli(g, chunk)
    r = loop.value("row", f"arith.divui {off}, {loop.idx(dim)} : index")
    col = loop.value("col", f"arith.remui {off}, {loop.idx(dim)} : index")
    bufs = [loop.alloc(n, l1_ty) for n in ("a_l1", "b_l1", "y_l1")]
    for buf, src in zip(bufs[:2], (a, bb)):
        loop.dma(buf, l1_ty, None, src, in_ty, ([r, col], [1, chunk], [dim, 1]))
    gen = loop.nested(
        f'linalg.generic {{indexing_maps = [{_MAP1}, {_MAP1}, {_MAP1}], iterator_types = ["parallel"]}} '
        f"ins({bufs[0]}, {bufs[1]} : {l1_ty}, {l1_ty}) outs({bufs[2]} : {l1_ty}) {{")
    ia, ib, io = (gen.names.fresh(n) for n in ("in_a", "in_b", "out"))
    gen.op(f"^bb0({ia}: bf16, {ib}: bf16, {io}: bf16):")
    fa = gen.value("fa", f"arith.extf {ia} : bf16 to f32")
    fb = gen.value("fb", f"arith.extf {ib} : bf16 to f32")
    s = gen.value("sum", f"arith.addf {fa}, {fb} : f32")
    sb = gen.value("sum_bf16", f"arith.truncf {s} : f32 to bf16")
    gen.op(f"linalg.yield {sb} : bf16")
    if flat_out:
        loop.dma(y, out_ty, ([off], [chunk], [1]), bufs[2], l1_ty, None)
    else:
        loop.dma(y, out_ty, ([r, col], [1, chunk], [dim, 1]), bufs[2], l1_ty, None)
    for buf in bufs:
        loop.dealloc(buf, l1_ty)
    return mod.text()
