"""numpy reference of the `gemm_bfp_bias` kernel (kernel_builder.reference has the contract): gemm_bias on the
decoded block-float weight (block_float.decode: exact bf16 values)."""
from __future__ import annotations

import numpy as np

from kernel_builder import block_float
from kernel_builder.gemm_bias.reference import gemm_bias


def gemm_bfp_bias(a, w, b, *, m: int, k: int, n: int) -> np.ndarray:
    """a . decode(w)^T + b with w the at-rest bytes [n/8, 9k], b [1, n]; one bf16 rounding of the f32 sum."""
    return gemm_bias(a, block_float.decode(np.asarray(w).reshape(-1), n, k), b, m=m, k=k, n=n)
