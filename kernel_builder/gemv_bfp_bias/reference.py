"""numpy reference of the `gemv_bfp_bias` kernel: the block-float GEMV's f32 sum (kernel_builder.gemv_bfp.reference:
x rounded to block float per 8, exact 8-term block dot products accumulated in f32) plus the bf16 bias in f32, then
one bf16 round-to-nearest-even."""
from __future__ import annotations

import numpy as np

from kernel_builder.gemv_bfp.reference import gemv_bfp_f32
from kernel_builder.numerics import F32, f32_input, to_bf16


def gemv_bfp_bias(w, x, b, *, m: int, k: int) -> np.ndarray:
    """y[1, m] = W x + b (w: the block-float bytes [m/8, 9k]; the bias added to the f32 sum, one rounding)."""
    y = gemv_bfp_f32(w, x, m=m, k=k, kind="gemv_bfp_bias")
    return to_bf16(y + f32_input("gemv_bfp_bias", "b", b, (1, m))[0]).reshape(1, m)
