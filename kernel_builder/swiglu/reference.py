"""numpy reference of the `swiglu` kernel (SwiGLU) with NPU numerics (kernel_builder.reference has the
contract: bf16 inputs, f32 arithmetic, one bf16 round-to-nearest-even on the output)."""
from __future__ import annotations

import numpy as np

from kernel_builder.numerics import F32, check_dims, f32_input, to_bf16


def swiglu(gate, up, *, rows: int, dim: int, pairs: int = 0) -> np.ndarray:
    """y = silu(gate) * up, silu(g) = g / (1 + exp(-g)). With `pairs` (builder.py): gate and up are the same
    [rows, 2*dim] input, gate its even blocks of `pairs` elements, up its odd ones."""
    check_dims("swiglu", rows=rows, dim=dim)
    if pairs:
        blocks = f32_input("swiglu", "gate", gate, (rows, 2 * dim)).reshape(-1, 2, pairs)
        ublocks = f32_input("swiglu", "up", up, (rows, 2 * dim)).reshape(-1, 2, pairs)
        g, u = blocks[:, 0].reshape(rows, dim), ublocks[:, 1].reshape(rows, dim)
    else:
        g = f32_input("swiglu", "gate", gate, (rows, dim))
        u = f32_input("swiglu", "up", up, (rows, dim))
    with np.errstate(over="ignore"):  # exp(-g) -> inf for very negative g gives silu = -0, as intended
        return to_bf16(g / (F32(1.0) + np.exp(-g)) * u)
