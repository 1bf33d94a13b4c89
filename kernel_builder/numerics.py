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
