"""GEMV: y[0, i] = sum_k w[i, k] * x[0, k]   (w row-major in HF (out, in) layout; f32 accumulate).

MLIR + external C++ (kernel_builder.externals.gemv_kernel). launch -> segment -> herd [herd_m, 1]: each
tile owns m/herd_m consecutive output rows, keeps x in L1 and streams [tile_m, k] row blocks of w through
L1, calling the external kernel once per block.
"""
from __future__ import annotations

from .. import planner
from ._emit import L1, Module, attr_dict, herd, launch, memref, segment

KIND = "gemv"


def build(m: int, k: int) -> str:
    from .. import externals  # lazy: the registry is owned by another module

    plan = planner.plan_gemv(m, k)
    ext = externals.gemv_kernel(k, plan.tile_m)
    w_ty, x_ty, y_ty = memref([m, k]), memref([1, k]), memref([1, m])
    wl_ty, xl_ty, yl_ty = memref([plan.tile_m, k], "bf16", L1), memref([k], "bf16", L1), \
        memref([plan.tile_m], "bf16", L1)
    mod = Module(KIND, [w_ty, x_ty, y_ty])
    mod.declare(ext.symbol, ext.obj, [wl_ty, xl_ty, yl_ty])
    types = [w_ty, x_ty, y_ty]

    la = launch(mod.body, [1, 1], list(zip(mod.args, types)), [attr_dict(KIND, {"m": m, "k": k})])
    seg = segment(la.body, "gemv_seg", list(zip(la.args, types)))
    h = herd(seg.body, "gemv_herd", (plan.herd_m, 1), list(zip(seg.args, types)),
             [f'link_with = "{ext.obj}"'])
    b = h.body
    w, x, y = h.args
    rows_per_tile = m // plan.herd_m

    xl = b.alloc("x_l1", xl_ty)
    b.dma(xl, xl_ty, None, x, x_ty, ([0, 0], [1, k], [k, 1]))
    row0 = b.muli(h.ids[0], rows_per_tile)
    loop, i = b.for_(0, rows_per_tile, plan.tile_m, "i")
    r = loop.addi(row0, i)
    wl = loop.alloc("w_l1", wl_ty)
    yl = loop.alloc("y_l1", yl_ty)
    loop.dma(wl, wl_ty, None, w, w_ty, ([r, 0], [plan.tile_m, k], [k, 1]))
    loop.call(ext.symbol, [(wl, wl_ty), (xl, xl_ty), (yl, yl_ty)])
    loop.dma(y, y_ty, ([0, r], [1, plan.tile_m], [m, 1]), yl, yl_ty, None)
    loop.dealloc(wl, wl_ty)
    loop.dealloc(yl, yl_ty)
    b.dealloc(xl, xl_ty)
    return mod.text()
