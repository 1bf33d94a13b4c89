"""bf16 helpers shared by every numpy reference and the emulator (NPU numerics: bf16 storage,
f32 arithmetic, round-to-nearest-even back to bf16)."""
from __future__ import annotations

import ml_dtypes
import numpy as np

BF16 = np.dtype(ml_dtypes.bfloat16)


def to_bf16(x) -> np.ndarray:
    """Round to bf16 with round-to-nearest-even (ml_dtypes' cast is RNE)."""
    return np.asarray(x, dtype=np.float32).astype(BF16)


def as_f32(x) -> np.ndarray:
    """View bf16 (or already-f32) data as float32 without copying when it is already f32."""
    x = np.asarray(x)
    return x if x.dtype == np.float32 else x.astype(np.float32)


def bf16_from_bytes(raw: bytes | bytearray | memoryview | np.ndarray, shape) -> np.ndarray:
    """Interpret raw device bytes as a bf16 array of `shape` (no copy)."""
    return np.frombuffer(raw, dtype=BF16).reshape(shape)
