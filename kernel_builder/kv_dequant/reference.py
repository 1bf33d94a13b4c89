"""numpy reference of the `kv_dequant` kernel: KV8 rows -> bf16 K and V rows (kernel_builder/kv_quant/reference.py
has the format; the values are exact in bf16)."""
from __future__ import annotations

import numpy as np

from kernel_builder.kv_quant.reference import dequantize, split_rows
from kernel_builder.numerics import check_dims, to_bf16


def kv_dequant(kv, *, rows: int, kv_heads: int, head_dim: int):
    """kv bytes [rows, row_bytes] -> (k, v) bf16 [rows, kv_heads*head_dim]."""
    check_dims("kv_dequant", rows=rows, kv_heads=kv_heads, head_dim=head_dim)
    kc, vc, ks, vs = split_rows(np.asarray(kv).reshape(rows, -1), kv_heads, head_dim)
    return (to_bf16(dequantize(kc, ks, kv_heads, head_dim)), to_bf16(dequantize(vc, vs, kv_heads, head_dim)))
