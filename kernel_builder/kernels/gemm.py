"""GEMM: c[m, n] = a[m, k] @ b[k, n]   (bf16 in, f32 accumulate, bf16 RNE out).

MLIR-only (codegen: linalg.matmul on L1 tiles). Structure (plan from planner.plan_gemm):
  air.launch over (m / BM, n / BN) output blocks, BM = herd_m*tile_m, BN = herd_n*tile_n
    air.segment: L2 panels a[BM, tile_k_l2], b[tile_k_l2, BN] and an f32 accumulator acc[BM, BN]
      scf.for over K in tile_k_l2 steps: DMA the panels L3 -> L2, then
        herd @gemm_acc [herd_m, herd_n]: each tile loads (or zero-fills on the first K step) its f32
          [tile_m, tile_n] accumulator, runs linalg.matmul over tile_k_l1 slices of the panels, stores it back
      herd @gemm_out [herd_m, herd_n]: f32 accumulator -> bf16 -> c (L3)
`transform_script(plan)` returns an optional transform-dialect script (tiling + vectorisation of the L1
matmul) for the compile step; build() does not depend on it.
"""
from __future__ import annotations

from .. import planner
from ._emit import L1, L2, Module, attr_dict, herd, launch, memref, segment

KIND = "gemm"
_MAP2 = "affine_map<(d0, d1) -> (d0, d1)>"


def build(m: int, k: int, n: int) -> str:
    p = planner.plan_gemm(m, k, n)
    bm, bn = p.herd_m * p.tile_m, p.herd_n * p.tile_n
    a_ty, b_ty, c_ty = memref([m, k]), memref([k, n]), memref([m, n])
    a2_ty, b2_ty = memref([bm, p.tile_k_l2], "bf16", L2), memref([p.tile_k_l2, bn], "bf16", L2)
    acc2_ty = memref([bm, bn], "f32", L2)
    a1_ty, b1_ty = memref([p.tile_m, p.tile_k_l1], "bf16", L1), memref([p.tile_k_l1, p.tile_n], "bf16", L1)
    acc1_ty, c1_ty = memref([p.tile_m, p.tile_n], "f32", L1), memref([p.tile_m, p.tile_n], "bf16", L1)

    mod = Module(KIND, [a_ty, b_ty, c_ty])
    types = [a_ty, b_ty, c_ty]
    la = launch(mod.body, [m // bm, n // bn], list(zip(mod.args, types)),
                [attr_dict(KIND, {"m": m, "k": k, "n": n})])
    seg = segment(la.body, "gemm_seg", list(zip(la.args, types)) + [(i, "index") for i in la.ids])
    s = seg.body
    a, b, c, bi, bj = seg.args
    m0, n0 = s.muli(bi, bm), s.muli(bj, bn)
    a2, b2, acc2 = s.alloc("a_l2", a2_ty), s.alloc("b_l2", b2_ty), s.alloc("acc_l2", acc2_ty)

    kloop, k0 = s.for_(0, k, p.tile_k_l2, "k")
    kloop.dma(a2, a2_ty, None, a, a_ty, ([m0, k0], [bm, p.tile_k_l2], [k, 1]))
    kloop.dma(b2, b2_ty, None, b, b_ty, ([k0, n0], [p.tile_k_l2, bn], [n, 1]))
    h = herd(kloop, "gemm_acc", (p.herd_m, p.herd_n),
             [(a2, a2_ty), (b2, b2_ty), (acc2, acc2_ty), (k0, "index")])
    _acc_body(h, p, bn, a2_ty, b2_ty, acc2_ty, a1_ty, b1_ty, acc1_ty)

    h = herd(s, "gemm_out", (p.herd_m, p.herd_n), [(acc2, acc2_ty), (c, c_ty), (m0, "index"), (n0, "index")])
    _out_body(h, p, n, bn, acc2_ty, c_ty, acc1_ty, c1_ty)
    s.dealloc(a2, a2_ty)
    s.dealloc(b2, b2_ty)
    s.dealloc(acc2, acc2_ty)
    return mod.text()


def _acc_body(h, p, bn, a2_ty, b2_ty, acc2_ty, a1_ty, b1_ty, acc1_ty) -> None:
    body = h.body
    a2, b2, acc2, k0 = h.args
    tm0, tn0 = body.muli(h.ids[0], p.tile_m), body.muli(h.ids[1], p.tile_n)
    acc = body.alloc("acc_l1", acc1_ty)
    first = body.value("first_k", f"arith.cmpi eq, {k0}, {body.idx(0)} : index")
    then, other = body.if_else(first)
    then.op(f"linalg.fill ins({then.f32(0.0)} : f32) outs({acc} : {acc1_ty})")
    other.dma(acc, acc1_ty, None, acc2, acc2_ty, ([tm0, tn0], [p.tile_m, p.tile_n], [bn, 1]))
    kl, k1 = body.for_(0, p.tile_k_l2, p.tile_k_l1, "kk")
    a1, b1 = kl.alloc("a_l1", a1_ty), kl.alloc("b_l1", b1_ty)
    kl.dma(a1, a1_ty, None, a2, a2_ty, ([tm0, k1], [p.tile_m, p.tile_k_l1], [p.tile_k_l2, 1]))
    kl.dma(b1, b1_ty, None, b2, b2_ty, ([k1, tn0], [p.tile_k_l1, p.tile_n], [bn, 1]))
    kl.op(f"linalg.matmul ins({a1}, {b1} : {a1_ty}, {b1_ty}) outs({acc} : {acc1_ty})")
    kl.dealloc(a1, a1_ty)
    kl.dealloc(b1, b1_ty)
    body.dma(acc2, acc2_ty, ([tm0, tn0], [p.tile_m, p.tile_n], [bn, 1]), acc, acc1_ty, None)
    body.dealloc(acc, acc1_ty)


def _out_body(h, p, n, bn, acc2_ty, c_ty, acc1_ty, c1_ty) -> None:
    body = h.body
    acc2, c, m0, n0 = h.args
    tm0, tn0 = body.muli(h.ids[0], p.tile_m), body.muli(h.ids[1], p.tile_n)
    acc = body.alloc("acc_l1", acc1_ty)
    out = body.alloc("c_l1", c1_ty)
    body.dma(acc, acc1_ty, None, acc2, acc2_ty, ([tm0, tn0], [p.tile_m, p.tile_n], [bn, 1]))
    gen = body.nested(
        f'linalg.generic {{indexing_maps = [{_MAP2}, {_MAP2}], iterator_types = ["parallel", "parallel"]}} '
        f"ins({acc} : {acc1_ty}) outs({out} : {c1_ty}) {{")
    i, o = gen.names.fresh("in"), gen.names.fresh("out")
    gen.op(f"^bb0({i}: f32, {o}: bf16):")
    t = gen.value("t", f"arith.truncf {i} : f32 to bf16")
    gen.op(f"linalg.yield {t} : bf16")
    r, col = body.addi(m0, tm0), body.addi(n0, tn0)
    body.dma(c, c_ty, ([r, col], [p.tile_m, p.tile_n], [n, 1]), out, c1_ty, None)
    body.dealloc(acc, acc1_ty)
    body.dealloc(out, c1_ty)


def transform_script(plan: planner.GemmPlan) -> str:
    """Transform-dialect script for the L1 matmul: tile it to the AIE2P 8x8x8 bf16 intrinsic shape and
    vectorise (run by the compile step before AIR lowering; optional)."""
    mm, kk, nn = planner.MMUL_M, planner.MMUL_K, planner.MMUL_N
    return f"""module attributes {{transform.with_named_sequence}} {{
  transform.named_sequence @__transform_main(%root: !transform.any_op {{transform.readonly}}) {{
    %mm = transform.structured.match ops{{["linalg.matmul"]}} in %root : (!transform.any_op) -> !transform.any_op
    %tiled, %loops:3 = transform.structured.tile_using_for %mm tile_sizes [{mm}, {nn}, {kk}] : (!transform.any_op) -> (!transform.any_op, !transform.any_op, !transform.any_op, !transform.any_op)
    transform.structured.vectorize %tiled vector_sizes [{mm}, {nn}, {kk}] : !transform.any_op
    transform.yield
  }}
}}
"""
