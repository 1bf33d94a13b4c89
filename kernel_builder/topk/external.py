"""The `topk` kernel's external C++ kernel (external_kernels/topk.cc): its shapes and symbols, the numpy model of
its portable path for the interpreter and its cost descriptor; FAMILY and COSTS register them with the spec."""
from __future__ import annotations

import re

import numpy as np

from external_kernels.compile_rules import ExternalKernel
from kernel_builder.external_costs import DEFAULT_STACK, CallWork, ExternalCost
from kernel_builder.external_models import need_memref
from kernel_builder.externals import ExternalFamily, check_multiple
from kernel_builder.hw.facts import NPU2
from kernel_builder.instr_counts import Counts, conv, load
from kernel_builder.planner import check_positive

TOPK_N_MULTIPLE = NPU2.vector_lanes_bf16   # 32-lane bf16 blocks on AIE2P
TOPK_MAX_K = 16                            # candidates kept (the host reads 8 bytes per candidate)
BLOCKS = (256, 128, 64, 32)                # logits per block max (the largest that divides n)


def block_of(n: int) -> int:
    return next(b for b in BLOCKS if n % b == 0)


def topk_kernel(n: int, k: int, base: int, valid: int) -> ExternalKernel:
    """(logits bf16[n], prev i32[2k], out i32[2k]): the k best of prev and logits[:valid] (ids base + i)."""
    check_positive("topk", n=n, k=k, valid=valid)
    check_multiple("topk", "n", n, TOPK_N_MULTIPLE)
    if k > TOPK_MAX_K:
        raise ValueError(f"topk: k={k} is more than the {TOPK_MAX_K} candidates the kernel keeps")
    if valid > n or base < 0:
        raise ValueError(f"topk: valid={valid} must be <= n={n} and base={base} >= 0")
    tag = f"n{n}_k{k}_b{base}_v{valid}"
    symbol = f"topk_bf16_{tag}"
    return ExternalKernel(symbol=symbol, obj=f"topk_{tag}.o", source="topk.cc",
                          defines=(("TOPK_N", str(n)), ("TOPK_K", str(k)), ("TOPK_BASE", str(base)),
                                   ("TOPK_VALID", str(valid)), ("TOPK_BLOCK", str(block_of(n))),
                                   ("TOPK_SYMBOL", symbol)))


def merge(logits: np.ndarray, prev: np.ndarray, k: int, base: int, valid: int) -> np.ndarray:
    """The kernel's result: i32 [2k] = k ids then their f32 values' bits, value descending, ties by smaller id
    (np.argmax's first maximum), empty slots id -1 / -inf."""
    prev = np.asarray(prev, dtype=np.int32).reshape(-1)
    ids = prev[:k]
    vals = prev[k:].view(np.float32)
    keep = ids >= 0
    cand_ids = np.concatenate([ids[keep].astype(np.int64), base + np.arange(valid, dtype=np.int64)])
    cand_vals = np.concatenate([vals[keep], np.asarray(logits, dtype=np.float32).reshape(-1)[:valid]])
    order = np.lexsort((cand_ids, -cand_vals))[:k]
    out_ids = np.full(k, -1, dtype=np.int32)
    out_vals = np.full(k, -np.inf, dtype=np.float32)
    out_ids[:order.size] = cand_ids[order]
    out_vals[:order.size] = cand_vals[order]
    return np.concatenate([out_ids, out_vals.view(np.int32)])


def topk_model(n: int, k: int, base: int, valid: int):
    def topk(logits, prev, out):
        x = need_memref(logits, "logits", n)
        p = need_memref(prev, "prev", 2 * k, "i32")
        need_memref(out, "out", 2 * k, "i32")[:] = merge(x, p, k, base, valid)
        out.written = True
    return topk


def _topk(m, args):
    """Counted formula of topk.cc's vector path: per full block of B logits, B/32 loads of 32 bf16 lanes, B/32 - 1
    lane-wise maxima, the widening to f32 (two conversions) and one reduce_max; one scalar f32 compare per block
    (the block's max against the k-th kept value). The element-wise rescans of the blocks that can enter the kept
    k compare the bf16 bit patterns as integers (no soft-float op); like every kernel's integer loop code they are
    not counted."""
    n, valid = int(m.group(1)), int(m.group(4))
    b = block_of(n)
    blocks = valid // b
    per_block = load(32, 2) * (b // 32) + Counts(vmax=b // 32 - 1) + conv(2) + Counts(reduce_max=1)
    return CallWork(valid, blocks, per_block * blocks)


FAMILY = ExternalFamily("topk", "topk.cc", r"topk_n(\d+)_k(\d+)_b(\d+)_v(\d+)\.o",
                        r"topk_bf16_n(\d+)_k(\d+)_b(\d+)_v(\d+)", topk_kernel, topk_model)
COSTS = (
    # topk(logits, prev, out): writes out only (never reads it)
    ExternalCost("topk", re.compile(FAMILY.symbol_re), _topk, DEFAULT_STACK, (2,), (2,)),
)
