"""numpy reference of the `gemv_bias` kernel with NPU numerics: the GEMV's f32 sum plus the bf16 bias, in f32,
then one bf16 round-to-nearest-even (kernel_builder.reference has the contract)."""
from __future__ import annotations

import numpy as np

from kernel_builder.gemv.reference import gemv_f32
from kernel_builder.numerics import F32, f32_input, to_bf16


def gemv_bias(w, x, b, *, m: int, k: int) -> np.ndarray:
    """y[1, m] = w[m, k] @ x[k] + b[m] (f32 accumulation, the bias added in f32, one rounding)."""
    y = gemv_f32(w, x, m=m, k=k, kind="gemv_bias").astype(F32)
    return to_bf16(y + f32_input("gemv_bias", "b", b, (1, m))[0]).reshape(1, m)
