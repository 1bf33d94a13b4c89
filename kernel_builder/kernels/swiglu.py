"""SwiGLU: y = silu(gate) * up = gate * sigmoid(gate) * up   (f32 math, bf16 RNE out).

MLIR + external C++ (kernel_builder.externals.swiglu_kernel). launch -> segment -> herd [herd, 1]: the
data is cut into chunks of `chunk` elements (chunk divides dim); each tile processes a contiguous range
of chunks, one external call per chunk.
"""
from __future__ import annotations

from .. import planner
from ._emit import L1, Module, attr_dict, herd, launch, memref, segment

KIND = "swiglu"


def build(rows: int, dim: int) -> str:
    from .. import externals

    plan = planner.plan_swiglu(rows, dim)
    chunk = plan.chunk
    ext = externals.swiglu_kernel(chunk)
    ty = memref([rows, dim])
    l1_ty = memref([chunk], "bf16", L1)
    mod = Module(KIND, [ty, ty, ty])
    mod.declare(ext.symbol, ext.obj, [l1_ty, l1_ty, l1_ty])
    types = [ty, ty, ty]

    la = launch(mod.body, [1, 1], list(zip(mod.args, types)),
                [attr_dict(KIND, {"rows": rows, "dim": dim})])
    seg = segment(la.body, "swiglu_seg", list(zip(la.args, types)))
    h = herd(seg.body, "swiglu_herd", (plan.herd, 1), list(zip(seg.args, types)),
             [f'link_with = "{ext.obj}"'])
    b = h.body
    gate, up, y = h.args
    first = b.muli(h.ids[0], plan.units_per_tile)
    loop, i = b.for_(0, plan.units_per_tile, 1, "c")
    g = loop.addi(first, i)
    off = loop.muli(g, chunk)
    r = loop.value("row", f"arith.divui {off}, {loop.idx(dim)} : index")
    col = loop.value("col", f"arith.remui {off}, {loop.idx(dim)} : index")
    gl, ul, yl = (loop.alloc(n, l1_ty) for n in ("gate_l1", "up_l1", "y_l1"))
    loop.dma(gl, l1_ty, None, gate, ty, ([r, col], [1, chunk], [dim, 1]))
    loop.dma(ul, l1_ty, None, up, ty, ([r, col], [1, chunk], [dim, 1]))
    loop.call(ext.symbol, [(gl, l1_ty), (ul, l1_ty), (yl, l1_ty)])
    loop.dma(y, ty, ([r, col], [1, chunk], [dim, 1]), yl, l1_ty, None)
    for buf in (gl, ul, yl):
        loop.dealloc(buf, l1_ty)
    return mod.text()
