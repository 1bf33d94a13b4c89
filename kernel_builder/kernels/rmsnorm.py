"""RMSNorm: y[r, :] = x[r, :] * rsqrt(mean(x[r, :]^2) + eps) * w   (bf16 in/out, f32 math).

MLIR-only (codegen). Emits a bare `air.herd` in the func body (the stitcher wraps it in launch/segment);
the herd's tiles split the rows, each tile streams `chunk` rows at a time through L1.
"""
from __future__ import annotations

from .. import planner
from ._emit import L1, Module, attr_dict, herd, memref

KIND = "rmsnorm"


def build(rows: int, dim: int, eps: float, group: int = 0) -> str:
    """`group` (a divisor of dim): normalise every `group` consecutive elements of a row on their own, with a
    [group] weight (per-head q/k norm); 0 = the whole row."""
    plan = planner.plan_rmsnorm(rows, dim)
    eps = float(eps)
    if not eps > 0.0:
        raise ValueError(f"rmsnorm: eps must be a positive float, got {eps!r}")
    g = group or dim
    if dim % g:
        raise ValueError(f"rmsnorm: group={group} does not divide dim={dim}")
    x_ty, w_ty = memref([rows, dim]), memref([g])
    mod = Module(KIND, [x_ty, w_ty, x_ty])
    params = {"rows": rows, "dim": dim, "eps": eps}
    if group:
        params["group"] = group
    attrs = [attr_dict(KIND, params)]
    h = herd(mod.body, "rmsnorm_herd", (plan.herd, 1),
             [(mod.args[0], x_ty), (mod.args[1], w_ty), (mod.args[2], x_ty)], attrs)
    b = h.body
    x, w, y = h.args
    tx = h.ids[0]
    chunk = plan.chunk
    wl_ty, rl_ty = memref([g], "bf16", L1), memref([chunk, dim], "bf16", L1)

    wl = b.alloc("w_l1", wl_ty)
    b.dma(wl, wl_ty, None, w, w_ty, ([0], [g], [1]))
    row0 = b.muli(tx, plan.units_per_tile)
    loop, i = b.for_(0, plan.units_per_tile, chunk, "r")
    r = loop.addi(row0, i)
    xl = loop.alloc("x_l1", rl_ty)
    yl = loop.alloc("y_l1", rl_ty)
    loop.dma(xl, rl_ty, None, x, x_ty, ([r, 0], [chunk, dim], [dim, 1]))

    rows_loop, rr = loop.for_(0, chunk, 1, "rr")
    groups_loop, g0 = rows_loop.for_(0, dim, g, "g0")
    rows_loop = groups_loop
    zero = rows_loop.f32(0.0)
    ss = rows_loop.names.fresh("sumsq")
    j, acc = rows_loop.names.fresh("j"), rows_loop.names.fresh("acc")
    red = rows_loop.nested(f"{ss} = scf.for {j} = {rows_loop.idx(0)} to {rows_loop.idx(g)} step "
                           f"{rows_loop.idx(1)} iter_args({acc} = {zero}) -> (f32) {{")
    jc = red.addi(g0, j)
    v = red.value("xv", f"memref.load {xl}[{rr}, {jc}] : {rl_ty}")
    f = red.value("xf", f"arith.extf {v} : bf16 to f32")
    sq = red.value("sq", f"arith.mulf {f}, {f} : f32")
    nxt = red.value("acc_next", f"arith.addf {acc}, {sq} : f32")
    red.op(f"scf.yield {nxt} : f32")
    mean = rows_loop.value("mean", f"arith.divf {ss}, {rows_loop.f32(float(g))} : f32")
    var = rows_loop.value("var_eps", f"arith.addf {mean}, {rows_loop.f32(eps)} : f32")
    inv = rows_loop.value("inv_rms", f"math.rsqrt {var} : f32")

    scale, jj = rows_loop.for_(0, g, 1, "j")
    jx = scale.addi(g0, jj)
    xv = scale.value("xv", f"memref.load {xl}[{rr}, {jx}] : {rl_ty}")
    wv = scale.value("wv", f"memref.load {wl}[{jj}] : {wl_ty}")
    xf = scale.value("xf", f"arith.extf {xv} : bf16 to f32")
    wf = scale.value("wf", f"arith.extf {wv} : bf16 to f32")
    n = scale.value("xn", f"arith.mulf {xf}, {inv} : f32")
    o = scale.value("yf", f"arith.mulf {n}, {wf} : f32")
    ob = scale.value("yb", f"arith.truncf {o} : f32 to bf16")
    scale.op(f"memref.store {ob}, {yl}[{rr}, {jx}] : {rl_ty}")

    loop.dma(y, x_ty, ([r, 0], [chunk, dim], [dim, 1]), yl, rl_ty, None)
    loop.dealloc(xl, rl_ty)
    loop.dealloc(yl, rl_ty)
    b.dealloc(wl, wl_ty)
    return mod.text()
