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


BLK = 64   # elements of an 8x8 block


def _to_bfp() -> Counts:        # a bf16 8x8 block loaded, widened, converted to bfp16ebs8
    return load(BLK, 2) + Counts(vconvert=1, bfp16_convert=1)


BFP = 72   # bytes of one v64bfp16ebs8 in memory: a buffer-stream push / pop is two 512-bit accesses
_PUSH = Counts(vstore=2, vstore_bytes=BFP)
_POP = Counts(vload=2, vload_bytes=BFP)


def q_blocks_taken(lk: int, lq: int, t: int, slot: int, qcycle: int) -> int:
    """Row blocks of Q item t that the core whose first block is stream block `slot` keeps."""
    taken = 0
    for u in range(2 * lk // 8):
        d = t * (2 * lk // 8) + u - slot
        taken += 0 <= d < (lq // 8) * qcycle and d % qcycle == 0
    return taken


@functools.lru_cache(maxsize=4096)
def prefill_item(hd: int, lq: int, lk: int, t: int, n_q: int, slot: int, q_pos0: int, qcycle: int = 1) -> Counts:
    """One prefill item call (attention.cc ATTN_MODE 1, AIE2P path): a Q item copies (scaled) the row blocks it
    holds of this core's tile; a K/V item zeroes the V rows no row sees, transposes the V blocks in place, then
    runs each 8-row block that sees a key of the tile (`continue`s as in the kernel). Every operand block is
    converted to block float once: Q when captured, K and the transposed V per item, P per row block."""
    db, kb = hd // 8, lk // 8
    if t < n_q:
        return scalar_bf16(2) + q_blocks_taken(lk, lq, t, slot, qcycle) * db * (
            load(BLK, 2) + vmac(BLK) * 2 + conv() + Counts(vconvert=1, bfp16_convert=1) + _PUSH)
    k_pos0 = (t - n_q) * lk
    step = 8 * qcycle
    q_last = q_pos0 + (lq // 8 - 1) * step + 7
    if k_pos0 > q_last:
        return Counts()
    c = store(8, 2) * ((lk - visible_keys(q_last, k_pos0, lk)) * db)                  # zeroed V rows
    c += (_to_bfp() + _PUSH) * (kb * db)                                             # K as block float
    c += (_to_bfp() + Counts(shuffle=1) + _PUSH) * (kb * db)                         # V^T blocks likewise
    blocks = Counter()
    for i in range(lq // 8):
        qp = q_pos0 + i * step
        if k_pos0 > qp + 7:
            continue
        blocks[tuple(visible_keys(qp + r, k_pos0, lk) for r in range(8))] += 1
    for vis, n in blocks.items():
        c += n * _row_block8(hd, lk, vis)
    return c


@functools.lru_cache(maxsize=None)
def _row_block8(hd: int, lk: int, vis: tuple) -> Counts:
    """One 8-row block: S = Q.K^T (two key blocks per Q block read), the softmax of its rows, its probabilities
    as block float, acc = alpha * acc + P.V (two dim blocks per P block read); operands re-read as block float."""
    db, kb = hd // 8, lk // 8
    scores = (kb // 2) * (db * (_POP * 3 + Counts(mmul_bfp16_8x8x8=2)) + conv(2) + store(LANES, 4) * 8)
    pv = kb * (_to_bfp() + _PUSH) + load(BLK, 4) + (db // 2) * ((load(BLK, 4) + fmul(BLK)) * 2 + kb * (
        _POP * 3 + Counts(mmul_bfp16_8x8x8=2)) + (conv() + store(BLK, 4)) * 2)
    return scores + softmax8(vis, lk) + pv


@functools.lru_cache(maxsize=None)
def softmax8(vis: tuple, lk: int) -> Counts:
    """attention.cc softmax8 over 8 rows, row r seeing keys [0, vis[r]) (full causal): the rows' maxima and
    sums by rows_reduce8 (9 max or 9 accumulator adds, 7 transposes, one 8-lane store each), not one reduce_max
    and one reduce_add per row."""
    c = _softmax_fixed(lk) + (Counts(broadcast=1) + store(8, 4)) * 8
    c += _tree8(Counts(vmax=1)) + _tree8(_vsub()) + store(8, 4) * 2
    for v in vis:
        if v == 0:
            c += Counts(broadcast=1) + store(8, 2) * (lk // 8)
            continue
        chunks = lk // LANES
        c += load(LANES, 4) + (chunks - 1) * (Counts(vmax=1) + load(LANES, 4))
        c += Counts(broadcast=1) + conv()
        for j in range(0, lk, LANES):
            c += load(LANES, 4) + _vsub() + exp2(LANES) + store(8, 2) * 2 + vmac(LANES)
            if j + LANES > v:   # the chunk holding the causal edge: masked probabilities zeroed through memory
                c += store(LANES, 2) + scalar_bf16(LANES - max(v - j, 0)) + load(LANES, 2)
    return c


def prefill_finish(hd: int, lq: int) -> Counts:
    c = Counts()
    for _ in range(0, lq, LANES):
        c += load(LANES, 4) + _reciprocal16() + store(LANES, 4)
    per_block = (Counts(broadcast=1) + store(8, 4)) * 8 + load(BLK, 4) + (hd // 8) * (
        load(BLK, 4) + fmul(BLK) + conv() + store(8, 2) * 8)
    return c + per_block * (lq // 8) + _reset_state(lq, hd)


def first_key(q_pos: int, k_pos0: int, lk: int, window: int) -> int:
    """The first key of the tile inside the query's sliding window (0 without one)."""
    return max(0, min(lk, q_pos - window + 1 - k_pos0)) if window else 0


def decode_step(hd: int, lq: int, lk: int, pos: int, k_pos0: int, window: int = 0) -> Counts:
    """One decode update: the keys [first, vis) of the tile (causal bound, sliding window) in dots and p.V."""
    vis, first = visible_keys(pos, k_pos0, lk), first_key(pos, k_pos0, lk, window)
    if first >= vis:
        return Counts()
    seen = vis - first
    groups = -(-(vis - first // 8 * 8) // 8)   # dots8 calls per row: 8 keys each from the 8-aligned key below first
    chunks = hd // DOT
    c = Counts()
    for i0 in range(0, lq, 4):
        n = min(4, lq - i0)
        c += n * groups * (_dots8(hd) + store(8, 4))
        c += softmax_rows([vis] * n, lk, first)
        passes = -(-chunks // 2)   # pv_pass: two 32-lane chunks per pass over the keys, one broadcast per key
        c += n * (chunks * (load(DOT, 4) + fmul(DOT) + conv() + store(DOT, 4))
                  + seen * (Counts(broadcast=passes) + chunks * (load(DOT, 2) + vmac(DOT))))
    return c


def _reduce8_tail(op: Counts) -> Counts:
    """attention.cc reduce8_tail: the 4 level-1 vectors loaded, 7 transposes and 5 ops (`op`: one)."""
    return load(LANES, 4) * 4 + Counts(shuffle=7) + op * 5


def _tree8(op: Counts) -> Counts:
    """The reduction tree over 8 rows' partial vectors in registers: 4 level-1 ops stored, then reduce8_tail."""
    return (op + store(LANES, 4)) * 4 + _reduce8_tail(op)


def _dots8(hd: int) -> Counts:
    """attention.cc dots8: 8 keys' hd/32 MACs of two 32-lane loads each, each key's halves added in the
    accumulator, tree level 1 as 4 accumulator adds, conversions and stores, then reduce8_tail with AddOp."""
    return (8 * ((hd // DOT) * (load(DOT, 2) * 2 + vmac(DOT)) + add_acc())
            + 4 * (add_acc() + conv() + store(LANES, 4)) + _reduce8_tail(_vsub()))


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
