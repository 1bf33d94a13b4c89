"""Head-major KV cache [n_layers, n_kv_heads, max_seq, head_dim] (bf16) and the CPU decode attention.

Prefill writes positions [0, prompt_len) of every layer from the kernels' k_roped / v rows; each decode
step writes one position and attends over [0, pos]. A float32 mirror of the same (bf16-exact) values is
kept so the per-token attention never converts the whole cache again.
"""
from __future__ import annotations

import numpy as np

from kernel_builder.numerics import BF16, to_bf16
from kernel_builder.reference import attention_scale

from .errors import PromptError


class KVCache:
    def __init__(self, n_layers: int, n_kv_heads: int, max_seq: int, head_dim: int, n_heads: int):
        if n_heads % n_kv_heads:
            raise ValueError(f"n_heads={n_heads} is not a multiple of n_kv_heads={n_kv_heads}")
        self.n_layers, self.n_kv_heads, self.max_seq, self.head_dim = n_layers, n_kv_heads, max_seq, head_dim
        self.n_heads = n_heads
        self.group = n_heads // n_kv_heads
        shape = (n_layers, n_kv_heads, max_seq, head_dim)
        self.k = np.zeros(shape, dtype=BF16)
        self.v = np.zeros(shape, dtype=BF16)
        self._kf = np.zeros(shape, dtype=np.float32)
        self._vf = np.zeros(shape, dtype=np.float32)
        self.scale = np.float32(attention_scale(head_dim))
        self.length = 0  # positions [0, length) hold real entries

    def _check(self, pos_end: int) -> None:
        if pos_end > self.max_seq:
            raise PromptError(f"KV cache full: position {pos_end - 1} is beyond its {self.max_seq} slots")

    def _heads(self, rows: np.ndarray, n: int) -> np.ndarray:
        """[n, kv_heads*hd] row-major kernel output -> head-major [kv_heads, n, hd]."""
        return rows[:n].reshape(n, self.n_kv_heads, self.head_dim).transpose(1, 0, 2)

    def write_prefill(self, layer: int, k_rows: np.ndarray, v_rows: np.ndarray, n: int) -> None:
        """Store the first n rows (the real prompt) of one layer's prefill K/V at positions [0, n)."""
        self._check(n)
        k, v = self._heads(k_rows, n), self._heads(v_rows, n)
        self.k[layer, :, :n] = k
        self.v[layer, :, :n] = v
        self._kf[layer, :, :n] = k
        self._vf[layer, :, :n] = v

    def attend(self, layer: int, pos: int, q: np.ndarray, k_row: np.ndarray, v_row: np.ndarray) -> np.ndarray:
        """Write the new k/v at `pos`, then attention of q [1, heads*hd] over positions [0, pos]
        (f32 scores and softmax, GQA, all heads in one batched matmul) -> bf16 [1, heads*hd]."""
        self._check(pos + 1)
        kh = k_row.reshape(self.n_kv_heads, self.head_dim)
        vh = v_row.reshape(self.n_kv_heads, self.head_dim)
        self.k[layer, :, pos] = kh
        self.v[layer, :, pos] = vh
        self._kf[layer, :, pos] = kh
        self._vf[layer, :, pos] = vh
        t = pos + 1
        qf = q.reshape(self.n_kv_heads, self.group, self.head_dim).astype(np.float32)
        keys = self._kf[layer, :, :t]            # [kv, t, hd]
        scores = np.matmul(qf, keys.transpose(0, 2, 1))  # [kv, group, t]
        scores *= self.scale
        scores -= scores.max(axis=-1, keepdims=True)
        np.exp(scores, out=scores)
        denom = scores.sum(axis=-1, keepdims=True)
        out = np.matmul(scores, self._vf[layer, :, :t]) / denom  # [kv, group, hd]
        return to_bf16(out.reshape(1, self.n_heads * self.head_dim))

    def reset(self) -> None:
        self.length = 0
