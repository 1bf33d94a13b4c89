"""The CPU decode-attention fallback (`--decode-attention host`) and the names of the KV cache states.

The KV cache itself lives on the device: per layer, two STATE buffers `k_cache` / `v_cache` of `capacity`
rows of kv_heads*head_dim bf16 (position-major: row p holds every KV head's vector of position p, exactly
the rows the K/V projections produce, so appending a chunk or a token is one contiguous window). Kernels
append and read it in place; nothing crosses to the host.

`HostAttention` is the `--decode-attention host` fallback: it mirrors the rows it needs from the device
(read once each, incrementally, kept as f32: bf16 values exactly) and computes one query row against positions
0..pos with `kernel_builder.reference.decode_attn`, the numerics the emulated NPU attention uses, so the two
decode paths give the same bytes (tests/test_state_contract.py).
"""
from __future__ import annotations

import numpy as np

from kernel_builder.reference import decode_attn

K_CACHE, V_CACHE = "k_cache", "v_cache"


class HostAttention:
    """CPU decode attention over a host mirror of the device KV cache (rows synced as they appear)."""

    def __init__(self, n_layers: int, heads: int, kv_heads: int, head_dim: int):
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        # f32 mirrors of the cache rows [positions, kv_heads*head_dim] (bf16-exact values)
        self.k = [np.zeros((0, kv_heads * head_dim), dtype=np.float32) for _ in range(n_layers)]
        self.v = [np.zeros((0, kv_heads * head_dim), dtype=np.float32) for _ in range(n_layers)]
        self.have = [0] * n_layers

    def reset(self) -> None:
        self.have = [0] * len(self.have)

    def truncate(self, keep: int) -> None:
        """Forget the mirrored rows from position `keep` on (the device cache is rewritten there)."""
        self.have = [min(h, keep) for h in self.have]

    def _sync(self, cache, layer: int, upto: int) -> None:
        have = self.have[layer]
        if upto <= have:
            return
        bo = f"L{layer}"
        if self.k[layer].shape[0] < upto:
            cap = max(upto, 2 * self.k[layer].shape[0])
            for arrs in (self.k, self.v):
                grown = np.zeros((cap, arrs[layer].shape[1]), dtype=np.float32)
                grown[:have] = arrs[layer][:have]
                arrs[layer] = grown
        for name, arrs in ((K_CACHE, self.k), (V_CACHE, self.v)):
            arrs[layer][have:upto] = cache.read_state(name, bo, have, upto)
        self.have[layer] = upto

    def attend(self, cache, layer: int, pos: int, q: np.ndarray, window: int | None = None,
               scale_dim: int | None = None) -> np.ndarray:
        """bf16 [1, heads*head_dim]: attention of the query at `pos` over positions 0..pos of `layer` (a sliding
        window and softmax-scale dimension as the attention op's params say)."""
        self._sync(cache, layer, pos + 1)
        n = pos + 1
        return decode_attn(q, self.k[layer][:n], self.v[layer][:n], pos, kv_rows=n, heads=self.heads,
                           kv_heads=self.kv_heads, head_dim=self.head_dim, window=window, scale_dim=scale_dim)
