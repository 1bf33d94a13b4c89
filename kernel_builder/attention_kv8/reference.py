"""numpy reference of the `attention_kv8` kernel: decode attention over the KV8 cache = the `attention` reference
over the cache dequantized to bf16 (exact: kernel_builder/kv_quant/reference.py), rows past the position zeroed
(they may hold anything, including bytes that are no scale)."""
from __future__ import annotations

import numpy as np

from kernel_builder.attention.reference import _attention_position, attention
from kernel_builder.kv_quant.reference import dequantize, split_rows


def dequantize_window(kv, rows_used: int, kv_rows: int, kv_heads: int, head_dim: int):
    """The bf16 values (as f32) of K and V of a KV8 window: rows [0, rows_used) dequantized, the rest 0."""
    kc, vc, ks, vs = split_rows(np.asarray(kv).reshape(kv_rows, -1)[:rows_used], kv_heads, head_dim)
    out = []
    for codes, sc in ((kc, ks), (vc, vs)):
        full = np.zeros((kv_rows, kv_heads * head_dim), dtype=np.float32)
        full[:rows_used] = dequantize(codes, sc, kv_heads, head_dim)
        out.append(full)
    return out


def attention_kv8(q, kv, pos, *, rows: int, kv_rows: int, heads: int, kv_heads: int, head_dim: int,
                  window: int | None = None, scale_dim: int | None = None) -> np.ndarray:
    """q bf16 [rows, heads*hd]; kv the window's KV8 rows (bytes [kv_rows, row_bytes]); pos the first query's
    position."""
    p = _attention_position(pos, rows=rows, kv_rows=kv_rows, heads=heads, kv_heads=kv_heads, head_dim=head_dim)
    kf, vf = dequantize_window(kv, p + rows, kv_rows, kv_heads, head_dim)
    return attention(q, kf, vf, pos, rows=rows, kv_rows=kv_rows, heads=heads, kv_heads=kv_heads, head_dim=head_dim,
                     window=window, scale_dim=scale_dim)
