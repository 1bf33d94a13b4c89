"""Instruction counts of attention.cc's AIE2P path per call (kernel_builder.instr_counts), the kernel's loops
written out with their trip counts: every loop bound and branch of the C++ appears here once, so
tests/test_kernel_counts.py (exact equality with the host aie_api's counts at the builders' shapes and at causal
edges) fails when the kernel's loops change and this file does not follow."""
from __future__ import annotations

import functools
from collections import Counter

from kernel_builder.hw.facts import NPU2
from kernel_builder.instr_counts import Counts, add_acc, conv, exp2, fmul, inv, load, load_unaligned, scalar_bf16
from kernel_builder.instr_counts import store, vmac

# attention.cc's kLanes (16-lane f32 statistics / softmax vectors) and kDotLanes (32-lane bf16 dot products)
LANES, DOT = NPU2.vector_lanes_f32, NPU2.vector_lanes_bf16


def visible_keys(q_pos: int, k_pos0: int, lk: int) -> int:
    return max(0, min(lk, q_pos - k_pos0 + 1))


def _mmul(block_float: bool) -> Counts:
    """One mmul<4, 8, 8> mul/mac step (docs/aie-api-host.md, "Counts")."""
    if block_float:
        return Counts(mmul_bfp16_8x8x8=1, bfp16_convert=2, shuffle=1, vconvert=2)
    return Counts(mmul_bf16_4x8x8_emulated=1, shuffle=9, broadcast=16, vmac_bf16=8)


def _vsub() -> Counts:          # vsub / vadd: both operands widened, one accumulator add, back to f32
    return conv(3) + add_acc()


def _reciprocal16() -> Counts:  # bf16 inv + one f32 Newton step
    return conv(7) + inv(LANES) + Counts(broadcast=1) + fmul(LANES) * 2


def _reset_state(lq: int, hd: int) -> Counts:
    return store(LANES, 4) * (lq * hd // LANES)


def softmax_rows(vis: list[int], lk: int, first: int = 0) -> Counts:
    """softmax_rows over len(vis) rows, row r seeing keys [first, vis[r]) (at least one)."""
    c = _softmax_fixed(lk)
    for v in vis:
        c = c + _softmax_row(min(v, lk), lk, first)
    return c


@functools.lru_cache(maxsize=None)
def _softmax_fixed(lk: int) -> Counts:
    c = load(LANES, 4) * 2 + Counts(vmax=1) + store(LANES, 4)                       # m_new
    c += Counts(broadcast=1) + _vsub() + store(LANES, 4)                            # masked argument
    c += scalar_bf16() + Counts(broadcast=1)                                         # ones
    c += _vsub() + Counts(broadcast=1, vmax=1) + exp2(LANES) + conv(2) + store(LANES, 4)   # alpha
    c += load(LANES, 4) * 2 + conv() + fmul(LANES) + conv() + store(LANES, 4)             # l
    return c


@functools.lru_cache(maxsize=None)
def _softmax_row(v: int, lk: int, first: int = 0) -> Counts:
    """One row seeing keys [first, v): scaled into log2 units and its max, then its probabilities and their
    sum."""
    chunks = lk // LANES
    c = chunks * (load(LANES, 4) + fmul(LANES) + conv() + store(LANES, 4))
    c += load(LANES, 4) + (chunks - 1) * (Counts(vmax=1) + load(LANES, 4)) + Counts(reduce_max=1)
    c += Counts(broadcast=1)
    for j in range(0, lk, LANES):
        c += load(LANES, 4) + _vsub() + exp2(LANES) + store(LANES, 2) + vmac(LANES)
        if j + LANES > v:   # the chunk holding the causal edge: masked probabilities zeroed, reloaded
            c += scalar_bf16(LANES - max(v - j, 0)) + load(LANES, 2)
        if j < first:       # a chunk before the sliding window's first key: those probabilities zeroed, reloaded
            c += scalar_bf16(min(LANES, first - j)) + load(LANES, 2)
    return c + conv() + Counts(reduce_add=1)


def prefill_init(hd: int, lq: int) -> Counts:
    return _reset_state(lq, hd) + store(DOT, 2) * (lq * hd // DOT)


@functools.lru_cache(maxsize=4096)
def prefill_item(hd: int, lq: int, lk: int, t: int, n_q: int, slot: int, q_pos0: int,
                 block_float: bool = False) -> Counts:
    if t < n_q:   # a Q item: this core copies its tile once
        return (load(DOT, 2) + store(DOT, 2)) * (lq * hd // DOT) if t == slot >> 1 else Counts()
    k_pos0 = (t - n_q) * lk
    if k_pos0 > q_pos0 + lq - 1:
        return Counts()
    c = store(DOT, 2) * ((lk - visible_keys(q_pos0 + lq - 1, k_pos0, lk)) * (hd // DOT))   # zeroed V rows
    blocks = Counter()
    for i0 in range(0, lq, 4):
        if k_pos0 > q_pos0 + i0 + 3:
            continue
        blocks[tuple(visible_keys(q_pos0 + i0 + r, k_pos0, lk) for r in range(4))] += 1
    for vis, n in blocks.items():
        c += n * _row_block(hd, lk, vis, block_float)
    return c


@functools.lru_cache(maxsize=None)
def _row_block(hd: int, lk: int, vis: tuple, block_float: bool) -> Counts:
    """One 4-row block: S = Q.K^T (K blocks transposed in registers), rows that see no key zeroed, the softmax of
    the others, acc = alpha * acc + P.V."""
    mm = _mmul(block_float)
    qk = (lk // 8) * ((hd // 8) * (load(8, 2) * 12 + Counts(shuffle=1) + mm) + conv() + store(8, 4) * 4)
    pv = (hd // 8) * ((load(8, 4) + fmul(8) + conv()) * 4 + (lk // 8) * (load(8, 2) * 12 + mm) + conv()
                      + store(8, 4) * 4)
    return (qk + store(LANES, 2) * ((lk // LANES) * sum(v == 0 for v in vis))
            + softmax_rows([v for v in vis if v], lk) + pv)


def prefill_finish(hd: int, lq: int) -> Counts:
    c = Counts()
    for i0 in range(0, lq, LANES):
        c += load(LANES, 4) + _reciprocal16() + store(LANES, 4)
        c += min(LANES, lq - i0) * (hd // LANES) * (load(LANES, 4) + fmul(LANES) + conv() + store(LANES, 2))
    return c + _reset_state(lq, hd)


def first_key(q_pos: int, k_pos0: int, lk: int, window: int) -> int:
    """The first key of the tile inside the query's sliding window (0 without one)."""
    return max(0, min(lk, q_pos - window + 1 - k_pos0)) if window else 0


def decode_step(hd: int, lq: int, lk: int, pos: int, k_pos0: int, window: int = 0) -> Counts:
    """One decode update: the keys [first, vis) of the tile (causal bound, sliding window) in dots and p.V."""
    vis, first = visible_keys(pos, k_pos0, lk), first_key(pos, k_pos0, lk, window)
    if first >= vis:
        return Counts()
    seen = vis - first
    c = Counts()
    for i0 in range(0, lq, 4):
        n = min(4, lq - i0)
        c += n * seen * ((hd // DOT) * (load(DOT, 2) * 2 + vmac(DOT)) + conv() + Counts(reduce_add=1))
        c += softmax_rows([vis] * n, lk, first)
        c += n * (hd // LANES) * (load(LANES, 4) + fmul(LANES) + seen * (load(LANES, 2) + Counts(broadcast=1)
                                                                         + vmac(LANES)) + conv() + store(LANES, 4))
    return c


def decode_merge(hd: int, lq: int, parts: int) -> Counts:
    c = load(LANES, 4) + (parts - 1) * (Counts(vmax=1) + load(LANES, 4))
    c += parts * (load(LANES, 4) + _vsub() + Counts(broadcast=1, vmax=1) + exp2(LANES) + conv(2)
                  + store(LANES, 4) + fmul(LANES) + load(LANES, 4))
    c += conv() + store(LANES, 4) + load(LANES, 4) + _reciprocal16() + store(LANES, 4)
    # part p starts p * lq * (hd + 2) floats into the (64-byte aligned) buffer: a 64-byte aligned start is one
    # load, any other two loads and a shuffle (load_unaligned_v)
    part = [load(LANES, 4) if p * lq * (hd + 2) % LANES == 0 else load_unaligned(LANES, 4) for p in range(parts)]
    c += lq * (hd // LANES) * (sum(part, Counts()) + parts * (Counts(broadcast=1) + fmul(LANES))
                               + conv(2) + fmul(LANES) + store(LANES, 2))
    return c
