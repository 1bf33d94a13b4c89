"""GEMM: c[m, n] = a[m, k] @ b[k, n]   (bf16 in, f32 accumulate, bf16 RNE out).

MLIR-only (codegen: linalg.matmul on L1 tiles). Structure (plan from planner.plan_gemm):
  module-level channels: @gemm_a [herd_m, 1] and @gemm_b [1, herd_n], both {broadcast_shape = [herd_m, herd_n]}
  air.launch over (m / BM, n / BN) output blocks, BM = herd_m*tile_m, BN = herd_n*tile_n
    air.segment @gemm_seg: scf.for over K in tile_k steps:
        DMA the A row panel a[BM, tile_k] and the B column panel b[tile_k, BN] L3 -> L2 (memory tile),
        air.channel.put @gemm_a[i, 0] <- A panel rows [i*tile_m, +tile_m)   for each herd row i
        air.channel.put @gemm_b[0, j] <- B panel cols [j*tile_n, +tile_n)   for each herd column j
      air.herd @gemm_herd [herd_m, herd_n]: each compute tile owns one [tile_m, tile_n] output tile for the whole
        reduction: an f32 accumulator in L1, zero-filled once (linalg.fill), then
        scf.for over K in tile_k steps: air.channel.get @gemm_a[tx, ty] / @gemm_b[tx, ty] into L1 A/B tiles,
        linalg.matmul; after the loop: f32 -> bf16 (truncf, RNE) into an L1 bf16 tile, DMA it to c (L3)

Why L2 panels + broadcast channels: a put on @gemm_a[i, 0] reaches the gets of all herd_n tiles of herd row i
(broadcast along dim 1), a put on @gemm_b[0, j] all herd_m tiles of column j, so per launch block each A/B
element crosses the shim once: A is read from DDR n/BN times and B m/BM times in total (instead of n/tile_n
and m/tile_m times when every tile DMA'd its own tiles from L3). The segment's K loop and the herd's K loop
hand the panels over in order: the i-th put on a channel index pairs with the i-th get on each of its
destinations (AIR channels are FIFOs). The ops are written in the synchronous form; AIR's dependency pass
makes them async and overlaps the segment's producer loop with the herd.

The L1 A/B tiles and the L2 panels are allocated inside their K loops so AIR's ping-pong transform can
double-buffer them; the planner budgets L1 and the memory tile for two of each.
`transform_script(plan)` returns a transform-dialect script (tile the L1 matmul to the 8x8x8 bf16
intrinsic, vectorise to vector.contract) for the compile step; build() does not depend on it.
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
    types = [a_ty, b_ty, c_ty]

    mod = Module(KIND, types)
    grid = [p.herd_m, p.herd_n]
    ch_a = mod.channel("gemm_a", [p.herd_m, 1], grid)   # herd row i: one put, herd_n gets
    ch_b = mod.channel("gemm_b", [1, p.herd_n], grid)   # herd column j: one put, herd_m gets
    la = launch(mod.body, [m // bm, n // bn], list(zip(mod.args, types)),
                [attr_dict(KIND, {"m": m, "k": k, "n": n})])
    seg = segment(la.body, "gemm_seg", list(zip(la.args, types)) + [(i, "index") for i in la.ids])
    s = seg.body
    a, b, c, bi, bj = seg.args
    m0, n0 = s.muli(bi, bm), s.muli(bj, bn)
    _segment_panels(s, p, k, n, a, a_ty, b, b_ty, m0, n0, ch_a, ch_b)
    h = herd(s, "gemm_herd", (p.herd_m, p.herd_n), [(c, c_ty), (m0, "index"), (n0, "index")])
    _herd_body(h, p, k, n, c_ty, ch_a, ch_b)
    return mod.text()


def _segment_panels(s, p: planner.GemmPlan, k: int, n: int, a: str, a_ty: str, b: str, b_ty: str,
                    m0: str, n0: str, ch_a: str, ch_b: str) -> None:
    """Per K step: A row panel [BM, tile_k] and B column panel [tile_k, BN] L3 -> L2, then one channel put per
    herd row (A) / column (B) slicing the panel."""
    bm, bn = p.herd_m * p.tile_m, p.herd_n * p.tile_n
    a2_ty, b2_ty = memref([bm, p.tile_k], "bf16", L2), memref([p.tile_k, bn], "bf16", L2)
    kl, k0 = s.for_(0, k, p.tile_k, "kp")
    a2, b2 = kl.alloc("a_l2", a2_ty), kl.alloc("b_l2", b2_ty)
    kl.dma(a2, a2_ty, None, a, a_ty, ([m0, k0], [bm, p.tile_k], [k, 1]))
    kl.dma(b2, b2_ty, None, b, b_ty, ([k0, n0], [p.tile_k, bn], [n, 1]))
    for i in range(p.herd_m):
        kl.channel_put(ch_a, [i, 0], a2, a2_ty, ([i * p.tile_m, 0], [p.tile_m, p.tile_k], [p.tile_k, 1]))
    for j in range(p.herd_n):
        kl.channel_put(ch_b, [0, j], b2, b2_ty, ([0, j * p.tile_n], [p.tile_k, p.tile_n], [bn, 1]))
    kl.dealloc(a2, a2_ty)
    kl.dealloc(b2, b2_ty)


def _herd_body(h, p: planner.GemmPlan, k: int, n: int, c_ty: str, ch_a: str, ch_b: str) -> None:
    a1_ty, b1_ty = memref([p.tile_m, p.tile_k], "bf16", L1), memref([p.tile_k, p.tile_n], "bf16", L1)
    acc_ty, out_ty = memref([p.tile_m, p.tile_n], "f32", L1), memref([p.tile_m, p.tile_n], "bf16", L1)
    body = h.body
    c, m0, n0 = h.args
    tx, ty = h.ids
    row = body.addi(m0, body.muli(tx, p.tile_m))
    col = body.addi(n0, body.muli(ty, p.tile_n))

    acc = body.alloc("acc_l1", acc_ty)
    body.op(f"linalg.fill ins({body.f32(0.0)} : f32) outs({acc} : {acc_ty})")
    kl, _ = body.for_(0, k, p.tile_k, "k")
    a1, b1 = kl.alloc("a_l1", a1_ty), kl.alloc("b_l1", b1_ty)
    kl.channel_get(ch_a, [tx, ty], a1, a1_ty, None)
    kl.channel_get(ch_b, [tx, ty], b1, b1_ty, None)
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
