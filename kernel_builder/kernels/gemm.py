"""GEMM: c[m, n] = a[m, k] @ b[k, n]   (bf16 in, f32 accumulate, bf16 RNE out).

MLIR-only (codegen: linalg.matmul on L1 tiles). Structure (plan from planner.plan_gemm):
  air.launch over (m / BM, n / BN) output blocks, BM = herd_m*tile_m, BN = herd_n*tile_n
    air.segment @gemm_seg (no L2 buffers)
      air.herd @gemm_herd [herd_m, herd_n]: each compute tile owns one [tile_m, tile_n] output tile for the whole
        reduction: an f32 accumulator in L1, zero-filled once (linalg.fill), then
        scf.for over K in tile_k steps: DMA a[tile_m, tile_k] and b[tile_k, tile_n] L3 -> L1, linalg.matmul
        after the loop: f32 -> bf16 (truncf, RNE) into an L1 bf16 tile, DMA it to c (L3)

Why L3 -> L1 directly (no L2 panels): the accumulator never leaves L1, and the K loop lives in the herd, so
the only per-K-step traffic is the bf16 A/B tiles. Staging shared A/B panels in L2 and broadcasting them
along the herd rows/columns would cut DDR reads by herd_n (A) and herd_m (B), but it needs the segment's K
loop and the herd's K loop to hand off buffers in order, i.e. `air.channel` put/get pairs. This builder uses
only `air.dma_memcpy_nd`, which every verifier we have (tests/air_checks.py, mlir-opt-22 on the generic
form, air-opt) checks; the channel/L2-broadcast variant is the planned next step (docs/kernels.md, gemm).
Cost of the choice: A is read herd_n times and B herd_m times from DDR; every tile drives its own shim DMA
streams (AIR's lowering must multiplex them over the shim DMA channels).

The A/B tiles are allocated inside the K loop so AIR's ping-pong transform can double-buffer them; the
planner budgets L1 for two of each.
`transform_script(plan)` returns a transform-dialect script (tile the L1 matmul to the 8x8x8 bf16
intrinsic, vectorise to vector.contract) for the compile step; build() does not depend on it.
"""
from __future__ import annotations

from .. import planner
from ._emit import L1, Module, attr_dict, herd, launch, memref, segment

KIND = "gemm"
_MAP2 = "affine_map<(d0, d1) -> (d0, d1)>"


def build(m: int, k: int, n: int) -> str:
    p = planner.plan_gemm(m, k, n)
    bm, bn = p.herd_m * p.tile_m, p.herd_n * p.tile_n
    a_ty, b_ty, c_ty = memref([m, k]), memref([k, n]), memref([m, n])
    types = [a_ty, b_ty, c_ty]

    mod = Module(KIND, types)
    la = launch(mod.body, [m // bm, n // bn], list(zip(mod.args, types)),
                [attr_dict(KIND, {"m": m, "k": k, "n": n})])
    seg = segment(la.body, "gemm_seg", list(zip(la.args, types)) + [(i, "index") for i in la.ids])
    s = seg.body
    a, b, c, bi, bj = seg.args
    m0, n0 = s.muli(bi, bm), s.muli(bj, bn)
    h = herd(s, "gemm_herd", (p.herd_m, p.herd_n),
             [(a, a_ty), (b, b_ty), (c, c_ty), (m0, "index"), (n0, "index")])
    _herd_body(h, p, k, n, a_ty, b_ty, c_ty)
    return mod.text()


def _herd_body(h, p: planner.GemmPlan, k: int, n: int, a_ty: str, b_ty: str, c_ty: str) -> None:
    a1_ty, b1_ty = memref([p.tile_m, p.tile_k], "bf16", L1), memref([p.tile_k, p.tile_n], "bf16", L1)
    acc_ty, out_ty = memref([p.tile_m, p.tile_n], "f32", L1), memref([p.tile_m, p.tile_n], "bf16", L1)
    body = h.body
    a, b, c, m0, n0 = h.args
    row = body.addi(m0, body.muli(h.ids[0], p.tile_m))
    col = body.addi(n0, body.muli(h.ids[1], p.tile_n))

    acc = body.alloc("acc_l1", acc_ty)
    body.op(f"linalg.fill ins({body.f32(0.0)} : f32) outs({acc} : {acc_ty})")
    kl, k0 = body.for_(0, k, p.tile_k, "k")
    a1, b1 = kl.alloc("a_l1", a1_ty), kl.alloc("b_l1", b1_ty)
    kl.dma(a1, a1_ty, None, a, a_ty, ([row, k0], [p.tile_m, p.tile_k], [k, 1]))
    kl.dma(b1, b1_ty, None, b, b_ty, ([k0, col], [p.tile_k, p.tile_n], [n, 1]))
    kl.op(f"linalg.matmul ins({a1}, {b1} : {a1_ty}, {b1_ty}) outs({acc} : {acc_ty})")
    kl.dealloc(a1, a1_ty)
    kl.dealloc(b1, b1_ty)

    out = body.alloc("c_l1", out_ty)
    gen = body.nested(
        f'linalg.generic {{indexing_maps = [{_MAP2}, {_MAP2}], iterator_types = ["parallel", "parallel"]}} '
        f"ins({acc} : {acc_ty}) outs({out} : {out_ty}) {{")
    i, o = gen.names.fresh("in"), gen.names.fresh("out")
    gen.op(f"^bb0({i}: f32, {o}: bf16):")
    t = gen.value("t", f"arith.truncf {i} : f32 to bf16")
    gen.op(f"linalg.yield {t} : bf16")
    body.dma(c, c_ty, ([row, col], [p.tile_m, p.tile_n], [n, 1]), out, out_ty, None)
    body.dealloc(acc, acc_ty)
    body.dealloc(out, out_ty)


def transform_script(plan: planner.GemmPlan) -> str:
    """Transform-dialect script for the herd's L1 linalg.matmul (`plan` fixes the tile shapes it runs on):
    tile it to the AIE2P 8x8x8 bf16 intrinsic, vectorise, and turn the vectorised reduction into a
    bf16 x bf16 -> f32 vector.contract (run by the compile step before AIR lowering; optional)."""
    mm, kk, nn = planner.MMUL_M, planner.MMUL_K, planner.MMUL_N
    for name, v, q in (("tile_m", plan.tile_m, mm), ("tile_k", plan.tile_k, kk), ("tile_n", plan.tile_n, nn)):
        if v % q:
            raise ValueError(f"gemm.transform_script: {name}={v} is not a multiple of the {mm}x{kk}x{nn} "
                             f"intrinsic")
    return f"""module attributes {{transform.with_named_sequence}} {{
  transform.named_sequence @__transform_main(%root: !transform.any_op {{transform.readonly}}) {{
    %mm = transform.structured.match ops{{["linalg.matmul"]}} in %root : (!transform.any_op) -> !transform.any_op
    %tiled, %loops:3 = transform.structured.tile_using_for %mm tile_sizes [{mm}, {nn}, {kk}] : (!transform.any_op) -> (!transform.any_op, !transform.any_op, !transform.any_op, !transform.any_op)
    transform.structured.vectorize %tiled : !transform.any_op
    %funcs = transform.structured.match ops{{["func.func"]}} in %root : (!transform.any_op) -> !transform.any_op
    transform.apply_patterns to %funcs {{
      transform.apply_patterns.vector.transfer_permutation_patterns
      transform.apply_patterns.vector.reduction_to_contract
      transform.apply_patterns.vector.fold_arith_extension
      transform.apply_patterns.canonicalization
    }} : !transform.any_op
    transform.yield
  }}
}}
"""
