"""numpy reference of the `rmsnorm` kernel (RMSNorm) with NPU numerics (kernel_builder.reference has the
contract: bf16 inputs, f32 arithmetic, one bf16 round-to-nearest-even on the output)."""
from __future__ import annotations

import numpy as np

from kernel_builder import block_float
from kernel_builder.numerics import F32, check_dims, f32_input, to_bf16


def rmsnorm(x, w, *, rows: int, dim: int, eps: float, group: int = 0, offset: int = 0, bfp: int = 0) -> np.ndarray:
    """y = x * rsqrt(mean(x^2) + eps) * (offset + w) per row; one rounding at the end. With `group` (a divisor of
    dim), every `group` consecutive elements of a row are normalised on their own with w of shape [group] (the
    per-head q/k norm of Qwen3-style models). `offset` 1: the weight is stored as w - 1 (Gemma's (1 + w), added
    in f32). `bfp` 1: the bf16 result in block float, the bytes kernel_builder.block_float.encode makes of it
    (int8 [rows/8, 9*dim]; rows a multiple of 8, whole rows)."""
    check_dims("rmsnorm", rows=rows, dim=dim)
    if bfp and (rows % block_float.BLOCK or dim % block_float.BLOCK or group):
        raise ValueError(f"rmsnorm: bfp=1 needs whole rows (no group) and rows, dim multiples of "
                         f"{block_float.BLOCK}, got rows={rows}, dim={dim}, group={group}")
    g = group or dim
    if dim % g:
        raise ValueError(f"rmsnorm: group={group} does not divide dim={dim}")
    xf = f32_input("rmsnorm", "x", x, (rows * (dim // g), g))
    wf = f32_input("rmsnorm", "w", w, (g,))
    if offset:
        wf = wf + F32(offset)
    mean_sq = np.einsum("ij,ij->i", xf, xf, dtype=F32) / F32(g)
    inv = F32(1.0) / np.sqrt(mean_sq + F32(eps), dtype=F32)
    y = to_bf16((xf * inv[:, None]) * wf).reshape(rows, dim)
    return block_float.encode(y).view(np.int8) if bfp else y
