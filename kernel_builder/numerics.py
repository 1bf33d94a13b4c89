"""bf16 helpers shared by every numpy reference and the emulator (NPU numerics: bf16 storage,
f32 arithmetic, round-to-nearest-even back to bf16)."""
from __future__ import annotations

import math

import ml_dtypes
import numpy as np

BF16 = np.dtype(ml_dtypes.bfloat16)
F32 = np.float32


def to_bf16(x) -> np.ndarray:
    """Round to bf16 with round-to-nearest-even (ml_dtypes' cast is RNE)."""
    return np.asarray(x, dtype=np.float32).astype(BF16)


def check_dims(kernel: str, **dims) -> None:
    """A reference's integer parameters are positive ints (ValueError naming the kernel and the parameter)."""
    for name, value in dims.items():
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value <= 0:
            raise ValueError(f"{kernel}: parameter {name} must be a positive int, got {value!r}")


def f32_input(kernel: str, name: str, x, shape: tuple[int, ...]) -> np.ndarray:
    """`x` as float32 with `shape` (a view when x is already f32 and contiguous)."""
    x = np.asarray(x)
    if x.dtype != BF16 and x.dtype != np.float32:
        raise ValueError(f"{kernel}: input {name} must be bf16 or float32, got {x.dtype}")
    expected = math.prod(shape)
    if x.size != expected:
        raise ValueError(f"{kernel}: input {name} has {x.size} elements (shape {x.shape}), expected {shape}")
    return x.reshape(shape).astype(np.float32, copy=False)


def to_bfp16ebs8(x) -> np.ndarray:
    """Block-float model of AIE2P's bfp16ebs8 (docs/aie-api-host.md, "Block float"), as float32: every 8
    consecutive values of the last axis share the exponent E of their largest magnitude and keep a signed 8-bit
    mantissa round-half-even(x / 2^(E-6)) clipped to [-128, 127]. A block holding inf/NaN becomes NaN. The same
    model as external_kernels/aie_api_host (an assumption: AMD publishes no bit-level description)."""
    x = np.asarray(x, dtype=np.float32)
    if x.shape[-1] % 8:
        raise ValueError(f"to_bfp16ebs8: last axis {x.shape[-1]} is not a multiple of 8")
    b = x.reshape(*x.shape[:-1], x.shape[-1] // 8, 8).astype(np.float64)
    amax = np.abs(b).max(axis=-1, keepdims=True)
    finite = np.isfinite(b).all(axis=-1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        e = np.where((amax > 0) & finite, np.frexp(np.where(finite, amax, 1.0))[1] - 1, 0).astype(np.float64)
        m = np.clip(np.rint(np.ldexp(b, (6 - e).astype(np.int32))), -128, 127)   # rint: ties to even
        q = np.where(finite, np.ldexp(m, (e - 6).astype(np.int32)), np.nan)
    return q.reshape(x.shape).astype(np.float32)
