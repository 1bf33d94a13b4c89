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
