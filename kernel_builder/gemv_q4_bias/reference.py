"""numpy reference of the `gemv_q4_bias` kernel: the 4-bit GEMV's f32 sum (weights dequantized to bf16 as the core
does; the host q4 GEMV on the stored rows when built, gemv_q4.reference.gemv_q4_f32) plus the bf16 bias in f32,
one bf16 RNE rounding."""
from __future__ import annotations

import numpy as np

from kernel_builder.gemv_q4.reference import gemv_q4_f32
from kernel_builder.numerics import F32, f32_input, to_bf16


def gemv_q4_bias(w, x, b, *, m: int, k: int, group: int, mins: int) -> np.ndarray:
    y = gemv_q4_f32(w, x, m=m, k=k, group=group, mins=mins, kind="gemv_q4_bias")
    return to_bf16(y.astype(F32) + f32_input("gemv_q4_bias", "b", b, (1, m))[0]).reshape(1, m)
