"""numpy reference of the `topk` kernel: the k best logits of one vocabulary partition merged with the running
candidates (greedy decode: k = 1, np.argmax's first maximum)."""
from __future__ import annotations

import numpy as np

from kernel_builder.numerics import f32_input
from kernel_builder.topk.external import merge


def topk(logits, prev, *, n: int, k: int, base: int, valid: int) -> np.ndarray:
    """i32 [1, 2k]: k ids then the bits of their f32 values, value descending, ties to the smaller id; ids are
    `base + i` for logits[i], i < valid (the rest is padding), and prev's ids (smaller than base)."""
    x = f32_input("topk", "logits", logits, (1, n))
    p = np.asarray(prev)
    if p.size != 2 * k:
        raise ValueError(f"topk: prev has {p.size} elements, expected {2 * k}")
    return merge(x, p.astype(np.int32), k, base, valid).reshape(1, 2 * k)


def candidates(out) -> tuple[np.ndarray, np.ndarray]:
    """(ids i64 [k], values f32 [k]) of a topk result (empty slots dropped)."""
    o = np.asarray(out, dtype=np.int32).reshape(-1)
    k = o.size // 2
    ids, vals = o[:k].astype(np.int64), o[k:].view(np.float32)
    keep = ids >= 0
    return ids[keep], vals[keep]


def empty(k: int) -> np.ndarray:
    """The i32 [1, 2k] of no candidates (the chain's first `prev`)."""
    return np.concatenate([np.full(k, -1, np.int32), np.full(k, -np.inf, np.float32).view(np.int32)]).reshape(1, -1)
