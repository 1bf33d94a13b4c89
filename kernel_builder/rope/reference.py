"""numpy reference of the `rope` kernel (RoPE) with NPU numerics (kernel_builder.reference has the
contract: bf16 inputs, f32 arithmetic, one bf16 round-to-nearest-even on the output)."""
from __future__ import annotations

import numpy as np

from kernel_builder.numerics import check_dims, f32_input, to_bf16


def rope(x, lut, *, rows: int, heads: int, head_dim: int) -> np.ndarray:
    """Half-split RoPE: per head, y1 = x1*cos - x2*sin, y2 = x2*cos + x1*sin with lut row = [cos | sin]."""
    check_dims("rope", rows=rows, heads=heads, head_dim=head_dim)
    if head_dim % 2:
        raise ValueError(f"rope: head_dim={head_dim} must be even")
    half = head_dim // 2
    xf = f32_input("rope", "x", x, (rows, heads, head_dim))
    lf = f32_input("rope", "lut", lut, (rows, 1, head_dim))
    x1, x2 = xf[..., :half], xf[..., half:]
    cos, sin = lf[..., :half], lf[..., half:]
    y = np.empty_like(xf)
    # bf16*bf16 products are exact in f32, so this equals the C++ order of operations bit for bit.
    np.subtract(x1 * cos, x2 * sin, out=y[..., :half])
    np.add(x2 * cos, x1 * sin, out=y[..., half:])
    return to_bf16(y.reshape(rows, heads * head_dim))
