"""The `attention` kernel's external C++ kernel (external_kernels/attention.cc): its shapes and symbols
(ExternalKernel), its numpy model for the interpreter (the .cc's portable path) and its cost/resource
descriptor for the hardware model; FAMILY and COSTS register them with the kernel spec."""
from __future__ import annotations

import functools
import re
from typing import NamedTuple

import numpy as np

from external_kernels.compile_rules import ExternalKernel
from kernel_builder.attention.reference import attention_scale
from kernel_builder.attention import counts as ac
from kernel_builder.external_costs import DEFAULT_STACK, CallWork, ExternalCost
from kernel_builder.external_models import F32, ModelError, need_memref
from kernel_builder.externals import ExternalFamily, check_multiple
from kernel_builder.hw.facts import NPU2
from kernel_builder.numerics import to_bf16
from kernel_builder.planner import check_positive

ATTN_HEAD_DIM_MULTIPLE = NPU2.vector_lanes_bf16   # the AIE2P 32-lane bf16 vector path
ATTN_LK_MULTIPLE = NPU2.vector_lanes_f32   # keys per K/V tile: whole 16-lane softmax vectors
ATTN_LQ_MULTIPLE = NPU2.bfp16_mmul_shape[0]  # prefill query rows per tile: whole 8-row blocks
ATTN_MAX_PARTS = NPU2.vector_lanes_f32     # decode merge: partial states combined in one 16-lane vector


class AttentionKernels(NamedTuple):
    """The tile primitives of one attention configuration; they share one object file (one compile).
    Prefill: (init, item, finish); decode: (init, step, merge)."""

    init: ExternalKernel
    update: ExternalKernel
    out: ExternalKernel

    @property
    def obj(self) -> str:
        return self.init.obj


def _variant(window: int | None, scale_dim: int | None, head_dim: int) -> tuple[int, int, str]:
    """(window, scale_dim, symbol suffix): `_w<W>` for a sliding window of W keys, `_s<D>` for a softmax scale of
    1/sqrt(D) with D != head_dim (Gemma's query_pre_attn_scalar); the default kernel keeps its name."""
    window, scale_dim = window or 0, scale_dim or head_dim
    check_positive("attention", scale_dim=scale_dim)
    if window < 0:
        raise ValueError(f"attention: window={window} must be positive (None: full causal)")
    return window, scale_dim, (f"_w{window}" if window else "") + (f"_s{scale_dim}" if scale_dim != head_dim else "")


def _attention(mode: str, head_dim: int, lq: int, lk: int, n_parts: int = 0, window: int | None = None,
               scale_dim: int | None = None) -> AttentionKernels:
    kind = "prefill" if mode == "p" else "decode"
    check_positive(f"attention {kind}", head_dim=head_dim, lq=lq, lk=lk)
    check_multiple("attention", "head_dim", head_dim, ATTN_HEAD_DIM_MULTIPLE)
    check_multiple("attention", "lk", lk, ATTN_LK_MULTIPLE)
    if mode == "p":
        check_multiple("attention", "lq", lq, ATTN_LQ_MULTIPLE)
        if not lk <= lq <= 2 * lk:
            raise ValueError(f"attention: lq={lq} must lie in [lk, 2*lk] = [{lk}, {2 * lk}] (the planner's tiles)")
        qcycle = n_parts or 1    # prefill: cores whose 8-row query blocks interleave (ATTN_QCYCLE)
        parts, tag = ("init", "item", "finish"), f"hd{head_dim}_q{lq}_k{lk}" + (f"_n{qcycle}" if qcycle > 1 else "")
    else:
        check_positive("attention decode", n_parts=n_parts)
        if n_parts > ATTN_MAX_PARTS:
            raise ValueError(f"attention: n_parts={n_parts} exceeds {ATTN_MAX_PARTS} (one 16-lane merge vector)")
        parts, tag = ("init", "step", "merge"), f"hd{head_dim}_q{lq}_k{lk}_n{n_parts}"
    window, scale_dim, suffix = _variant(window, scale_dim, head_dim)
    tag += suffix
    syms = [f"attn{mode}_{part}_bf16_{tag}" for part in parts]
    defines = (
        ("ATTN_MODE", "1" if mode == "p" else "2"),
        ("ATTN_HEAD_DIM", str(head_dim)),
        ("ATTN_LQ", str(lq)),
        ("ATTN_LK", str(lk)),
        *((("ATTN_NPARTS", str(n_parts)),) if mode == "d" else ()),
        # prefill: the block-float matrix path (aie_api's flag, as gemm.cc and mlir-air's attention are built; the
        # vector path requires it) and the interleave of the herd's 8-row query blocks
        *((("ATTN_QCYCLE", str(n_parts or 1)), ("AIE_API_EMULATE_BFLOAT16_MMUL_WITH_BFP16", "1")) if mode == "p"
          else ()),
        # f32 bits of 1/sqrt(head_dim) as a C hex-float literal: the C++ and the numpy reference use the same scale.
        ("ATTN_SCALE", float.hex(attention_scale(scale_dim)) + "f"),
        *((("ATTN_WINDOW", str(window)),) if window else ()),
        ("ATTN_INIT_SYMBOL", syms[0]),
        ("ATTN_UPDATE_SYMBOL", syms[1]),
        ("ATTN_OUT_SYMBOL", syms[2]),
    )
    obj = f"attn{mode}_{tag}.o"
    return AttentionKernels(*(ExternalKernel(symbol=s_, obj=obj, source="attention.cc", defines=defines)
                              for s_ in syms))


def attention_prefill_kernels(head_dim: int, lq: int, lk: int, window: int | None = None,
                              scale_dim: int | None = None, qcycle: int = 1) -> AttentionKernels:
    """Prefill tile primitives for [lq, head_dim] query tiles and 8x8-blocked items of 2*lk rows
    (external_kernels/attention.cc; `qcycle` cores interleave their 8-row query blocks, object suffix _n<qcycle>):

    init(state f32[lq*(hd+2)], q bf16[lq*hd])
    item(item bf16[2*lk*hd], q, state, int32 t, int32 n_q, int32 slot, int32 q_pos0)
        (slot = the Q stream's block holding the core's first row block)
    finish(state, out bf16[lq*hd])
    """
    check_positive("attention prefill", qcycle=qcycle)
    return _attention("p", head_dim, lq, lk, qcycle, window, scale_dim)


def attention_decode_kernels(head_dim: int, lq: int, lk: int, n_parts: int, window: int | None = None,
                             scale_dim: int | None = None) -> AttentionKernels:
    """Decode tile primitives for the lq query rows of one GQA group, K/V tiles of lk rows and a merge of
    n_parts partial states:

    init(state f32[lq*(hd+2)])
    step(item bf16[(2*lk+lq)*hd], state, int32 pos, int32 k_pos0)
    merge(parts f32[n_parts*lq*(hd+2)], out bf16[lq*hd])
    """
    return _attention("d", head_dim, lq, lk, n_parts, window, scale_dim)
_LOWEST = np.finfo(F32).min  # -0x1.fffffep127f, "no key seen yet"


def _online_softmax_update(acc, m, l_, k, v, q, qpos, k_pos0: int, window: int | None, scale) -> bool:
    """One K/V tile (k, v [lk, hd]) into the online-softmax state (acc [lq, hd], m, l_ [lq], updated in place) of
    the query rows q [lq, hd] at positions qpos, keys at k_pos0..; False (nothing changed) when no row sees a key
    of the tile."""
    lq, lk = len(qpos), len(k)
    vis = np.clip(qpos - k_pos0 + 1, 0, lk)                       # visible keys: a range per row
    first = np.clip(qpos - window + 1 - k_pos0, 0, lk) if window else np.zeros_like(vis)
    rows = vis > first
    if not rows.any():
        return False
    keep = (np.arange(lk)[None, :] < vis[:, None]) & (np.arange(lk)[None, :] >= first[:, None])   # [lq, lk]
    qf, kf, vf = q.astype(F32), k.astype(F32), v.astype(F32)
    with np.errstate(all="ignore"):                                # masked keys may hold anything
        # dot products accumulated over d sequentially in f32 (the host loop's order)
        s = np.cumsum(qf[:, None, :] * kf[None, :, :], axis=2, dtype=F32)[:, :, -1] * scale
        row_max = np.where(keep, s, _LOWEST).max(axis=1)
        m_new = np.where(m > row_max, m, row_max).astype(F32)
        alpha = np.exp(m - m_new).astype(F32)
        p = np.where(keep, np.exp(s - m_new[:, None]), F32(0.0)).astype(F32)
    new_acc = acc * alpha[:, None]
    total = np.zeros(lq, dtype=F32)
    for j in range(lk):  # sequential over keys, as in the host loop; masked keys are skipped
        kj = keep[:, j]
        total[kj] += p[kj, j]
        new_acc[kj] += p[kj, j, None] * vf[j][None, :]
    acc[rows] = new_acc[rows]
    l_[rows] = (alpha * l_ + total)[rows]
    m[rows] = m_new[rows]
    return True


def _merge_partials(data, lq: int, hd: int):
    """The f32 output rows [lq, hd] of n_parts partial states (data [n_parts, lq*(hd+2)]), in the host order."""
    n_parts = len(data)
    acc = data[:, :lq * hd].reshape(n_parts, lq, hd)
    m, l_ = data[:, lq * hd:lq * hd + lq], data[:, lq * hd + lq:]
    mx = np.full(lq, _LOWEST, dtype=F32)
    for s in range(n_parts):
        mx = np.where(m[s] > mx, m[s], mx)
    w = np.exp(m - mx[None, :]).astype(F32)                        # [n_parts, lq]
    total = np.zeros(lq, dtype=F32)
    o = np.zeros((lq, hd), dtype=F32)
    for s in range(n_parts):                                      # sequential over parts (host order)
        total += w[s] * l_[s]
    for s in range(n_parts):
        o += w[s][:, None] * acc[s]
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(total[:, None] > 0, o / np.where(total > 0, total, F32(1.0))[:, None], F32(0.0))


def attention_model(mode: str, part: str, hd: int, lq: int, lk: int, n_parts: int | None, window: int | None = None,
                    scale_dim: int | None = None):
    """attention.cc (kernels/attention.py): prefill (mode "p": init / item / finish) and decode (mode "d": init /
    step / merge) primitives on the f32 state acc[lq*hd] | m[lq] | l[lq]; `window`: the sliding window."""
    scale = F32(attention_scale(scale_dim or hd))
    n_state = lq * (hd + 2)

    def parts_of(state):
        data = need_memref(state, "state", n_state, "f32")
        return data[:lq * hd].reshape(lq, hd), data[lq * hd:lq * hd + lq], data[lq * hd + lq:]

    def reset(state):
        acc, m, l_ = parts_of(state)
        acc[:] = 0.0
        m[:] = _LOWEST
        l_[:] = 0.0
        state.written = True

    def init(state, q=None):
        reset(state)
        if mode == "p":          # prefill: init(state, q) also zeroes the query tile
            if q is None:
                raise ModelError("prefill init takes (state, q)")
            need_memref(q, "q", lq * hd)[:] = 0
            q.written = True
        elif q is not None:
            raise ModelError("decode init takes (state)")

    def update(k, v, q, state, q_pos0: int, q_step: int, k_pos0: int, qpos=None):
        acc, m, l_ = parts_of(state)
        qpos = q_pos0 + q_step * np.arange(lq) if qpos is None else qpos
        if _online_softmax_update(acc, m, l_, k, v, q, qpos, k_pos0, window, scale):
            state.written = True

    qcycle = n_parts or 1                                 # prefill: the herd's interleaved 8-row blocks
    row_pos = (np.arange(lq) // 8) * 8 * qcycle + np.arange(lq) % 8   # local row -> position - q_pos0

    def unblock(x, rows):
        """8x8-blocked [rows/8][hd/8][8][8] -> [rows, hd] (the L1 layout the builder's DMA makes)."""
        return x.reshape(rows // 8, hd // 8, 8, 8).transpose(0, 2, 1, 3).reshape(rows, hd)

    def item(it, q, state, t, n_q, slot, q_pos0):
        t, n_q, slot, q_pos0 = int(t), int(n_q), int(slot), int(q_pos0)
        data = need_memref(it, "item", 2 * lk * hd).reshape(2 * lk // 8, hd * 8)
        qd = need_memref(q, "q", lq * hd).reshape(lq // 8, hd * 8)
        if t < n_q:      # stream block slot + i * qcycle is this core's row block i
            for u in range(2 * lk // 8):
                d = t * (2 * lk // 8) + u - slot
                if 0 <= d < (lq // 8) * qcycle and d % qcycle == 0:
                    qd[d // qcycle] = data[u]
                    q.written = True
            return
        rows = unblock(data, 2 * lk)
        update(rows[:lk], rows[lk:], unblock(qd, lq), state, q_pos0, 1, (t - n_q) * lk, q_pos0 + row_pos)

    def step(it, state, pos, k_pos0):
        data = need_memref(it, "item", (2 * lk + lq) * hd).reshape(2 * lk + lq, hd)
        update(data[:lk], data[lk:2 * lk], data[2 * lk:], state, int(pos), 0, int(k_pos0))

    def finish(state, out):
        acc, _, l_ = parts_of(state)
        with np.errstate(divide="ignore", invalid="ignore"):
            o = np.where(l_[:, None] > 0, acc / np.where(l_ > 0, l_, F32(1.0))[:, None], F32(0.0))
        need_memref(out, "out", lq * hd)[:] = to_bf16(o).reshape(-1)
        out.written = True
        reset(state)             # ready for the next query block

    def merge(parts, out):
        data = need_memref(parts, "parts", n_parts * n_state, "f32").reshape(n_parts, n_state)
        need_memref(out, "out", lq * hd)[:] = to_bf16(_merge_partials(data, lq, hd)).reshape(-1)
        out.written = True

    table = {("p", "init"): init, ("p", "item"): item, ("p", "finish"): finish,
             ("d", "init"): init, ("d", "step"): step, ("d", "merge"): merge}
    if (mode, part) not in table:
        raise ModelError(f"attention: no {part!r} primitive in mode {mode!r}")
    return table[(mode, part)]
ATTN_ROW_BLOCK = NPU2.bfp16_mmul_shape[0]   # query rows per block-float mmul<8, 8, 8> block of the prefill item


def attn_prefill_blocks(lq: int, lk: int, q_pos0: int, k_pos0: int, window: int = 0, qcycle: int = 1) -> int:
    """Row blocks (8 query rows, block i at q_pos0 + i * 8 * qcycle) that attention.cc's prefill `item` computes
    against the K/V tile at k_pos0 (AIE2P `update_prefill`): none when every key lies after every query of the
    tile (the early return) or, with a sliding window, before every query's window, else the blocks whose last row
    sees the tile's first key and whose first row's window reaches the tile (the `continue`s skip the others)."""
    step = ATTN_ROW_BLOCK * qcycle
    last = q_pos0 + (lq // ATTN_ROW_BLOCK - 1) * step + ATTN_ROW_BLOCK - 1
    if k_pos0 > last or (window and k_pos0 + lk - 1 <= q_pos0 - window):
        return 0
    return sum(1 for i in range(lq // ATTN_ROW_BLOCK) if k_pos0 <= q_pos0 + i * step + ATTN_ROW_BLOCK - 1
               and not (window and k_pos0 + lk - 1 <= q_pos0 + i * step - window))


def _attn(m, args):
    """attention.cc (kernels/attention.py): the instruction counts of kernel_builder.attention.counts, which
    follow the AIE2P path's loops. Prefill item: with its operands (t, n_q, slot, q_pos0) known, a Q item
    (t < n_q) is a copy of at most one tile, a K/V item computes only the row blocks `attn_prefill_blocks` names
    (the kernel skips the others, causal); with an operand unknown, a full tile seen whole by every row. The
    kernel's own compile defines decide the mmul path (block-float or aie_api's emulation). Decode step: with
    (pos, k_pos0) unknown, every key of the tile visible."""
    mode, part, hd, lq, lk = m.group(1), m.group(2), int(m.group(3)), int(m.group(4)), int(m.group(5))
    n = int(m.group(6) or 1)
    window, scale_dim = int(m.group(7) or 0), int(m.group(8) or 0)
    qk = pv = lq * lk * hd
    ints = [a if isinstance(a, int) else None for a in args]
    get = lambda i: ints[i] if len(ints) > i else None   # noqa: E731
    if part == "init":
        return CallWork(0, 0, ac.prefill_init(hd, lq) if mode == "p" else ac._reset_state(lq, hd))
    if part == "item":
        # the counts are the full-causal ones: a sliding window's skipped tiles are not subtracted (an upper bound)
        t, n_q, slot, q_pos0 = (get(i) for i in (3, 4, 5, 6))
        if t is None or n_q is None or q_pos0 is None:   # a full K/V tile, every key visible to every row
            t, n_q, slot, q_pos0 = 1, 1, 0, lq * n + lk
        elif slot is None:
            slot = 0
        c = ac.prefill_item(hd, lq, lk, t, n_q, slot, q_pos0, n)
        return CallWork(512 * c.get("mmul_bfp16_8x8x8", 0), 0, c)   # one block-float 8x8x8 = 512 MACs
    if part == "step":
        pos, k0 = get(2), get(3)
        if pos is None or k0 is None:
            pos, k0 = lk - 1, 0
        return CallWork(qk + pv, 0, ac.decode_step(hd, lq, lk, pos, k0, window))
    if part == "finish":   # out = acc * (1/l) and the state emptied for the next query block
        return CallWork(lq * hd, 0, ac.prefill_finish(hd, lq))
    return CallWork(n * lq * hd, 0, ac.decode_merge(hd, lq, n))   # merge


_VARIANT = r"(?:_w(\d+))?(?:_s(\d+))?"   # sliding window, softmax-scale dimension (_variant)
FAMILY = ExternalFamily("attention", "attention.cc",
                        r"attn(p|d)_hd(\d+)_q(\d+)_k(\d+)(?:_n(\d+))?" + _VARIANT + r"\.o",
                        r"attn(p|d)_(init|item|finish|step|merge)_bf16_hd(\d+)_q(\d+)_k(\d+)(?:_n(\d+))?" + _VARIANT,
                        lambda mode, hd, lq, lk, n, w=None, sd=None: _attention(mode, hd, lq, lk, n or 0, w, sd).init,
                        attention_model)
COSTS = (
    ExternalCost("attn_init", re.compile(r"attn(p)_(init)_bf16_hd(\d+)_q(\d+)_k(\d+)(?:_n(\d+))?" + _VARIANT), _attn,
                 DEFAULT_STACK, (0, 1), (0, 1)),
    ExternalCost("attn_init", re.compile(r"attn(d)_(init)_bf16_hd(\d+)_q(\d+)_k(\d+)_n(\d+)" + _VARIANT), _attn,
                 DEFAULT_STACK, (0,), (0,)),
    ExternalCost("attn_item", re.compile(r"attn(p)_(item)_bf16_hd(\d+)_q(\d+)_k(\d+)(?:_n(\d+))?" + _VARIANT), _attn,
                 DEFAULT_STACK, (1, 2), valued=(3, 4, 6)),
    ExternalCost("attn_finish", re.compile(r"attn(p)_(finish)_bf16_hd(\d+)_q(\d+)_k(\d+)(?:_n(\d+))?" + _VARIANT), _attn,
                 DEFAULT_STACK, (1,), (1,)),
    ExternalCost("attn_step", re.compile(r"attn(d)_(step)_bf16_hd(\d+)_q(\d+)_k(\d+)_n(\d+)" + _VARIANT), _attn,
                 DEFAULT_STACK, (1,)),
    ExternalCost("attn_merge", re.compile(r"attn(d)_(merge)_bf16_hd(\d+)_q(\d+)_k(\d+)_n(\d+)" + _VARIANT), _attn,
                 DEFAULT_STACK, (1,), (1,)),
)
