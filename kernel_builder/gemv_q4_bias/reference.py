"""numpy reference of the `gemv_q4_bias` kernel: the 4-bit GEMV's f32 sum (weights dequantized to bf16 as the core
does) plus the bf16 bias in f32, one bf16 RNE rounding."""
from __future__ import annotations

import numpy as np

from kernel_builder.gemv.reference import gemv_f32
from kernel_builder.gemv_q4.format import Q4Layout, dequantize
from kernel_builder.numerics import F32, check_dims, f32_input, to_bf16


def gemv_q4_bias(w, x, b, *, m: int, k: int, group: int, mins: int) -> np.ndarray:
    check_dims("gemv_q4_bias", m=m, k=k)
    lay = Q4Layout(k, group, bool(mins))
    wa = np.asarray(w)
    wa = wa.view(np.uint8) if wa.dtype.itemsize == 1 else wa.astype(np.int8).view(np.uint8)
    if wa.size != m * lay.row_bytes:
        raise ValueError(f"gemv_q4_bias: w has {wa.size} bytes, m={m} rows of {lay.row_bytes} bytes expected")
    y = gemv_f32(dequantize(wa.reshape(-1), k, group, bool(mins)), x, m=m, k=k, kind="gemv_q4_bias")
    return to_bf16(y.astype(F32) + f32_input("gemv_q4_bias", "b", b, (1, m))[0]).reshape(1, m)
