"""The `attention_kv8` kernel's external C++ kernel: attention.cc compiled with ATTN_MODE 3 (its step in
external_kernels/attention_kv8.h; init and merge are ATTN_MODE 2's): shapes and symbols, the numpy model for the
interpreter, and the counted cost (kernel_builder.attention.counts plus the dequantization of the visible rows)."""
from __future__ import annotations

import re

import numpy as np

from external_kernels.compile_rules import ExternalKernel
from kernel_builder.attention import counts as ac
from kernel_builder.attention.external import (ATTN_HEAD_DIM_MULTIPLE, ATTN_LK_MULTIPLE, ATTN_MAX_PARTS,
                                               AttentionKernels, _variant, attention_model)
from kernel_builder.attention.reference import attention_scale
from kernel_builder.external_costs import DEFAULT_STACK, CallWork, ExternalCost
from kernel_builder.external_models import F32, ModelError, need_memref
from kernel_builder.externals import ExternalFamily, check_multiple
from kernel_builder.instr_counts import Counts, add_acc, conv, load, load_unaligned, store
from kernel_builder.planner import check_positive

SCALE_PAIR = 8    # bytes per key in an item: its K and V f32 scales


def item_bytes(head_dim: int, lk: int, lq: int) -> int:
    """One core item: lk key blocks (K codes, V codes, K scale, V scale), the group's query rows (bf16 bytes)."""
    return lk * (2 * head_dim + SCALE_PAIR) + 2 * lq * head_dim


def attention_kv8_kernels(head_dim: int, lq: int, lk: int, n_parts: int, window: int | None = None,
                          scale_dim: int | None = None) -> AttentionKernels:
    """init(state f32[lq*(hd+2)]); step(item i8[item_bytes], state, int32 pos, int32 k_pos0);
    merge(parts f32[n_parts*lq*(hd+2)], out bf16[lq*hd])."""
    check_positive("attention_kv8", head_dim=head_dim, lq=lq, lk=lk, n_parts=n_parts)
    check_multiple("attention_kv8", "head_dim", head_dim, ATTN_HEAD_DIM_MULTIPLE)
    check_multiple("attention_kv8", "lk", lk, ATTN_LK_MULTIPLE)
    if n_parts > ATTN_MAX_PARTS:
        raise ValueError(f"attention_kv8: n_parts={n_parts} exceeds {ATTN_MAX_PARTS} (one 16-lane merge vector)")
    window, scale_dim, suffix = _variant(window, scale_dim, head_dim)
    tag = f"hd{head_dim}_q{lq}_k{lk}_n{n_parts}{suffix}"
    syms = [f"attnk_{part}_bf16_{tag}" for part in ("init", "step", "merge")]
    defines = (("ATTN_MODE", "3"), ("ATTN_HEAD_DIM", str(head_dim)), ("ATTN_LQ", str(lq)), ("ATTN_LK", str(lk)),
               ("ATTN_NPARTS", str(n_parts)), ("ATTN_SCALE", float.hex(attention_scale(scale_dim)) + "f"),
               *((("ATTN_WINDOW", str(window)),) if window else ()),
               ("ATTN_INIT_SYMBOL", syms[0]), ("ATTN_UPDATE_SYMBOL", syms[1]), ("ATTN_OUT_SYMBOL", syms[2]))
    return AttentionKernels(*(ExternalKernel(symbol=s, obj=f"attnk_{tag}.o", source="attention.cc", defines=defines)
                              for s in syms))


def shift_of(scale_bytes: np.ndarray) -> np.ndarray:
    """The shifts of power-of-two f32 scales given as bytes (attention_kv8.h kv8_shift)."""
    bits = np.ascontiguousarray(scale_bytes).view(np.uint32)
    return 127 - ((bits >> 23) & 0xFF).astype(np.int32)


def attention_kv8_model(part: str, hd: int, lq: int, lk: int, n_parts: int, window: int | None = None,
                        scale_dim: int | None = None):
    if part in ("init", "merge"):
        return attention_model("d", part, hd, lq, lk, n_parts, window, scale_dim)
    if part != "step":
        raise ModelError(f"attention_kv8: no {part!r} primitive")
    update_item = attention_model("d", "step", hd, lq, lk, n_parts, window, scale_dim)

    def step(item, state, pos, k_pos0):
        data = need_memref(item, "item", item_bytes(hd, lk, lq), "i8")
        q0 = lk * (2 * hd + SCALE_PAIR)
        qd = (np.ascontiguousarray(data[q0:]).view(np.uint16).astype(np.uint32) << 16).view(np.float32)
        blocks = data[:q0].reshape(lk, 2 * hd + SCALE_PAIR)
        sh = shift_of(np.ascontiguousarray(blocks[:, 2 * hd:])).reshape(lk, 2)
        codes = blocks[:, :2 * hd].reshape(lk, 2, hd).transpose(1, 0, 2).astype(F32)
        vis = int(np.clip(int(pos) - int(k_pos0) + 1, 0, lk))
        deq = np.zeros((2 * lk + lq, hd), dtype=F32)
        for t in range(2):   # rows past the position are not dequantized (they may hold anything)
            deq[t * lk:t * lk + vis] = codes[t, :vis] * np.ldexp(F32(1.0), -sh[:vis, t])[:, None]
        deq[2 * lk:] = qd.reshape(lq, hd)
        update_item(_Item(deq.reshape(-1)), state, pos, k_pos0)
    return step


class _Item:
    """The dequantized item [K; V; q] handed to ATTN_MODE 2's model (a memref-like view)."""

    dtype = "bf16"

    def __init__(self, data):
        self.data, self.written = data, False


def step_counts(hd: int, lq: int, lk: int, pos: int, k_pos0: int, window: int = 0) -> Counts:
    """attention_kv8.h's vector path: per visible key, per 32 lanes of K and of V, the code load (an unaligned load:
    two loads and a shuffle, unless the key's block is 32-byte aligned), to_float (2 conv + 2 accumulator adds) and
    the bf16 store; then ATTN_MODE 2's update."""
    vis, first = ac.visible_keys(pos, k_pos0, lk), ac.first_key(pos, k_pos0, lk, window)
    if first >= vis:
        return Counts()
    block = 2 * hd + SCALE_PAIR
    c = Counts()
    for j in range(first, vis):
        ld = load(32, 1) if (j * block) % 32 == 0 else load_unaligned(32, 1)
        c += (hd // 32) * 2 * (ld + conv(2) + add_acc(2) + store(32, 2))
    return c + ac.decode_step(hd, lq, lk, pos, k_pos0, window)


def _attnk(m, args):
    part, hd, lq, lk, n = m.group(1), int(m.group(2)), int(m.group(3)), int(m.group(4)), int(m.group(5))
    window = int(m.group(6) or 0)
    if part == "init":
        return CallWork(0, 0, ac._reset_state(lq, hd))
    if part == "merge":
        return CallWork(n * lq * hd, 0, ac.decode_merge(hd, lq, n))
    ints = [a if isinstance(a, int) else None for a in args]
    pos, k0 = (ints[2], ints[3]) if len(ints) > 3 else (None, None)
    if pos is None or k0 is None:
        pos, k0 = lk - 1, 0
    return CallWork(2 * lq * lk * hd, 0, step_counts(hd, lq, lk, pos, k0, window))


_VARIANT = r"(?:_w(\d+))?(?:_s(\d+))?"
_SYM = r"attnk_(init|step|merge)_bf16_hd(\d+)_q(\d+)_k(\d+)_n(\d+)" + _VARIANT
FAMILY = ExternalFamily("attention_kv8", "attention.cc", r"attnk_hd(\d+)_q(\d+)_k(\d+)_n(\d+)" + _VARIANT + r"\.o",
                        _SYM, lambda hd, lq, lk, n, w=None, sd=None: attention_kv8_kernels(hd, lq, lk, n, w, sd).init,
                        lambda part, hd, lq, lk, n, w=None, sd=None: attention_kv8_model(part, hd, lq, lk, n, w, sd))
COSTS = (
    ExternalCost("attnk_init", re.compile(_SYM.replace("(init|step|merge)", "(init)")), _attnk, DEFAULT_STACK,
                 (0,), (0,)),
    ExternalCost("attnk_step", re.compile(_SYM.replace("(init|step|merge)", "(step)")), _attnk, DEFAULT_STACK,
                 (1,), valued=(2, 3)),
    ExternalCost("attnk_merge", re.compile(_SYM.replace("(init|step|merge)", "(merge)")), _attnk, DEFAULT_STACK,
                 (1,), (1,)),
)
