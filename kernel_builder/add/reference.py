"""numpy reference of the `add` kernel (residual add) with NPU numerics (kernel_builder.reference has the
contract: bf16 inputs, f32 arithmetic, one bf16 round-to-nearest-even on the output)."""
from __future__ import annotations

import numpy as np

from kernel_builder.numerics import check_dims, f32_input, to_bf16


def add(a, b, *, rows: int, dim: int, flat_out: int = 0) -> np.ndarray:
    """y = a + b (residual add); `flat_out` returns [rows*dim] instead of [rows, dim]."""
    check_dims("add", rows=rows, dim=dim)
    y = to_bf16(f32_input("add", "a", a, (rows, dim)) + f32_input("add", "b", b, (rows, dim)))
    return y.reshape(rows * dim) if flat_out else y
