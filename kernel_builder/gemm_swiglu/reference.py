"""numpy reference of the `gemm_swiglu` kernel with NPU numerics (kernel_builder.reference has the contract)."""
from __future__ import annotations

import numpy as np

from kernel_builder.gemm.reference import gemm
from kernel_builder.gemm_swiglu.layout import split
from kernel_builder.numerics import F32, to_bf16


def gemm_swiglu(a, w, *, m: int, k: int, n: int) -> np.ndarray:
    """swiglu(gemm(a, w_gate), gemm(a, w_up)) with w the [2n, k] interleave of w_gate and w_up (layout.py): each
    product rounded to bf16 before the activation, as the unfused launches round it (external_kernels/gemm.cc glu
    rounds its accumulators the same way)."""
    w_gate, w_up = split(np.asarray(w).reshape(2 * n, k))
    g = gemm(a, w_gate, m=m, k=k, n=n).astype(F32)
    u = gemm(a, w_up, m=m, k=k, n=n).astype(F32)
    with np.errstate(over="ignore"):   # exp(-g) -> inf for very negative g gives silu = -0, as intended
        return to_bf16(g / (F32(1.0) + np.exp(-g)) * u)
