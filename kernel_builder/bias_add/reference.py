"""numpy reference of the `bias_add` kernel with NPU numerics (kernel_builder.reference has the contract: bf16
inputs, f32 arithmetic, one bf16 round-to-nearest-even on the output)."""
from __future__ import annotations

from kernel_builder.numerics import check_dims, f32_input, to_bf16


def bias_add(x, b, *, rows: int, dim: int):
    """y[r, :] = x[r, :] + b for every row r (b: [1, dim] or [dim])."""
    check_dims("bias_add", rows=rows, dim=dim)
    return to_bf16(f32_input("bias_add", "x", x, (rows, dim)) + f32_input("bias_add", "b", b, (1, dim)))
