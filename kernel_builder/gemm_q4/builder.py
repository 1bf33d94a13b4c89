"""q4 GEMM: c[m, n] = a[m, k] @ dequant(w_q4)[n, k]^T with the weight in the 4-bit row format
(kernel_builder/gemv_q4/format.py: group `group`, with mins) dequantized tile by tile in L1 (docs/quantization.md,
"Prefill"): the prefill GEMM of `--weights q4` without a bf16 copy of the weight in DDR.

The structure is the bf16 GEMM's (kernel_builder/gemm/builder.py: launch over output blocks, one segment, the 8x4
herd with an f32 accumulator per tile, A panels re-blocked to 8x8 by the memory-tile DMA, C row panels drained
through L2), with the W side in 4 bits:

  per launch point, for each herd column j, one L2 W panel holding all its k/tile_k slices back to back, each in
  the L1 layout [codes: tile_n rows x tile_k/2 bytes][per row: tile_k/G scales, tile_k/G mins]
  (external_kernels/gemm_q4.cc), filled by two L3 -> L2 DMAs, each a 2-D block of the q4 rows (the codes
  [tile_n, k/2]; the scales and mins [tile_n, 4k/G], contiguous in a row), written slice by slice: 2-D on the shim
  side, so the launch loops fold into their BDs; per L2 K step (index t) one A panel per a_share (2) herd rows (one
  load, one 8x8-blocked put per herd row: half the bf16 GEMM's A panels, so the memory tiles have the S2MM channels
  for the W panels' second loads), and per slice one contiguous put of the W panel down @gemm_b[0, j]
  in the herd: each K step gets the A tile and the q4 slice and calls mac(a, wq, acc, scratch, wst), which
  dequantizes the slice into the 8x8-blocked bf16 tile `wst` and runs gemm.cc's mac on it

Every DMA moves whole 32-bit words: a slice's codes are tile_k/2 bytes per row, its scales 2*tile_k/G (tile_k is a
multiple of 2G).
"""
from __future__ import annotations

from kernel_builder.emit import L1, L2, Module, attr_dict, herd, launch, memref, segment
from kernel_builder.gemm import builder as gb
from kernel_builder.gemm.external import scratch_elems
from kernel_builder.gemm_q4 import plan as q4_plan
from kernel_builder.gemm_q4.external import gemm_q4_kernels

KIND = "gemm_q4"


def build(m: int, k: int, n: int, group: int = 32) -> str:
    """The module of c[m, n]: arguments (a bf16 [m, k], w i8 [n, row_bytes] (q4 rows), c bf16 [m, n])."""
    p = q4_plan.plan_gemm_q4(m, k, n, group)
    ext = gemm_q4_kernels(p.tile_m, p.tile_k, p.tile_n, group)
    rb = p.w_row_bytes(k)
    a_ty, w_ty, c_ty = memref([m, k]), memref([n, rb], "i8"), memref([m, n])
    acc_ty = memref([2 * p.tile_m * p.tile_n], "bf16", L1)
    a1_ty, q1_ty = memref([p.tile_m * p.tile_k], "bf16", L1), memref([p.slice_bytes], "i8", L1)
    s1_ty, w1_ty = memref([scratch_elems(p.tile_m, p.tile_k)], "bf16", L1), memref([p.tile_n * p.tile_k], "bf16", L1)
    mod = Module(KIND, [a_ty, w_ty, c_ty])
    mod.declare(ext.zero.symbol, ext.obj, [acc_ty])
    mod.declare(ext.mac.symbol, ext.obj, [a1_ty, q1_ty, acc_ty, s1_ty, w1_ty])
    mod.declare(ext.out.symbol, ext.obj, [acc_ty])
    grid = [p.herd_m, p.herd_n]
    ch_a = mod.channel("gemm_a", [p.herd_m, 1], grid)
    ch_b = mod.channel("gemm_b", [1, p.herd_n], grid)
    ch_c = mod.channel("gemm_c", grid)
    la = launch(mod.body, [m // p.bm, n // p.bn_out], list(zip(mod.args, types := [a_ty, w_ty, c_ty])),
                [attr_dict(KIND, {"m": m, "k": k, "n": n, "group": group})])
    seg = segment(la.body, "gemm_seg", list(zip(la.args, types)) + [(i, "index") for i in la.ids])
    s = seg.body
    a, w, c, bi, bj = seg.args
    m0, n0 = s.muli(bi, p.bm), s.muli(bj, p.launch_n())
    _stage_panels(s, p, k, n, rb, (a, a_ty), (w, w_ty), m0, n0, ch_a, ch_b)
    h = herd(s, "gemm_herd", (p.herd_m, p.herd_n), [], [f'link_with = "{ext.obj}"'])
    _herd_body(h, p, k, ext, (acc_ty, a1_ty, q1_ty, s1_ty, w1_ty), ch_a, ch_b, ch_c)
    gb._drain(s, p, n, c, c_ty, m0, n0, ch_c)
    return mod.text()


def _stage_panels(s, p: q4_plan.GemmQ4Plan, k: int, n: int, rb: int, a_arg, w_arg, m0: str, n0: str, ch_a: str,
                  ch_b: str) -> None:
    """Per launch point, per herd column: its whole W panel (all k / tile_k slices) with two L3 -> L2 DMAs, each a
    2-D block of the q4 rows (the codes [tile_n, k/2]; the scales and mins [tile_n, 4k/G], contiguous in a row),
    written slice by slice. Then per L2 K step the A panels (as the bf16 GEMM) and one put per tile_k slice of
    each panel."""
    (a, a_ty), (w, w_ty) = a_arg, w_arg
    k2, tk, sb = p.tile_k_l2, p.tile_k, p.slice_bytes
    slices = k // tk
    w2_ty = memref([slices * sb], "i8", L2)
    w2 = []
    code_bytes, sm_run = p.tile_n * tk // 2, 2 * tk // p.group
    for j in range(p.herd_n):
        buf = s.alloc("w_l2", w2_ty)
        row = gb._plus(s, n0, gb._col0(p, j, n))
        # the codes: [tile_n, k/2] bytes -> each slice's [tile_n, tk/2]
        s.dma(buf, w2_ty, ([0, 0, 0], [p.tile_n, slices, tk // 2], [tk // 2, sb, 1]),
              w, w_ty, ([row, 0], [p.tile_n, k // 2], [rb, 1]))
        # each row's scales then mins over k -> each slice's [tile_n][2][tk/G] bf16 after its codes
        s.dma(buf, w2_ty, ([0, 0, 0, code_bytes], [p.tile_n, 2, slices, sm_run], [2 * sm_run, sm_run, sb, 1]),
              w, w_ty, ([row, k // 2], [p.tile_n, 4 * k // p.group], [rb, 1]))
        w2.append(buf)
    rows = p.a_share * p.tile_m      # one A panel serves a_share herd rows (one load, one put per herd row)
    a2_ty = memref([rows, k2], "bf16", L2)
    kl, t = s.for_(0, k // k2, 1, "kt")
    kp = kl.muli(t, k2)
    a2 = [kl.alloc("a_l2", a2_ty) for _ in range(p.herd_m // p.a_share)]
    for i, buf in enumerate(a2):
        kl.dma(buf, a2_ty, None, a, a_ty, ([gb._plus(kl, m0, i * rows), kp], [rows, k2], [k, 1]))
    sl, kb = kl.for_(0, k2 // gb.BLOCK, tk // gb.BLOCK, "kb")
    for i in range(p.herd_m):
        off, sizes, strides = gb._blocked(p.tile_m, tk, k2, kb)
        off = [(i % p.a_share) * p.tile_m // gb.BLOCK] + off[1:]
        sl.channel_put(ch_a, [i, 0], a2[i // p.a_share], a2_ty, (off, sizes, strides))
    w_off = sl.addi(sl.muli(kb, sb * gb.BLOCK // tk), sl.muli(t, (k2 // tk) * sb))
    for j, buf in enumerate(w2):
        sl.channel_put(ch_b, [0, j], buf, w2_ty, ([w_off], [sb], [1]))
    for buf in a2:
        kl.dealloc(buf, a2_ty)
    for buf in w2:
        s.dealloc(buf, w2_ty)


def _herd_body(h, p: q4_plan.GemmQ4Plan, k: int, ext, types: tuple, ch_a: str, ch_b: str, ch_c: str) -> None:
    acc_ty, a1_ty, q1_ty, s1_ty, w1_ty = types
    body = h.body
    tx, ty = h.ids
    acc = body.alloc("acc_l1", acc_ty)
    scratch = body.alloc("bfp_l1", s1_ty)
    wst = body.alloc("wdq_l1", w1_ty)
    for buf, ty_ in ((scratch, s1_ty), (wst, w1_ty)):
        body.pin_to_scope(buf, ty_)    # written and read by the call: one copy, outside the ping-ponged loop
    body.call(ext.zero.symbol, [(acc, acc_ty)])
    kl, _ = body.for_(0, k, p.tile_k, "k")
    a1, q1 = kl.alloc("a_l1", a1_ty), kl.alloc("wq_l1", q1_ty)
    kl.channel_get(ch_a, [tx, ty], a1, a1_ty, None)
    kl.channel_get(ch_b, [tx, ty], q1, q1_ty, None)
    kl.call(ext.mac.symbol, [(a1, a1_ty), (q1, q1_ty), (acc, acc_ty), (scratch, s1_ty), (wst, w1_ty)])
    kl.dealloc(a1, a1_ty)
    kl.dealloc(q1, q1_ty)
    body.call(ext.out.symbol, [(acc, acc_ty)])
    body.channel_put(ch_c, [tx, ty], acc, acc_ty, ([0], [p.tile_m * p.out_n], [1]))
    for buf, ty_ in ((acc, acc_ty), (scratch, s1_ty), (wst, w1_ty)):
        body.dealloc(buf, ty_)
