"""numpy reference of the `gemm_bias` kernel with NPU numerics (kernel_builder.reference has the contract)."""
from __future__ import annotations

import numpy as np

from kernel_builder.gemm.reference import gemm_f32
from kernel_builder.numerics import f32_input, to_bf16


def gemm_bias(a, w, b, *, m: int, k: int, n: int) -> np.ndarray:
    """a . w^T + b (b: [1, n]) with one bf16 rounding of the f32 sum."""
    return to_bf16(gemm_f32(a, w, m=m, k=k, n=n) + f32_input("gemm_bias", "b", b, (1, n)))
