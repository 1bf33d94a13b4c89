"""numpy reference of the `kv_quant` kernel (the KV8 cache writer) and the KV8 format's (de)quantization, shared by
the decode attention over the int8 cache (kernel_builder/attention_kv8) and the host side.

Format (docs/quantization.md "KV cache"): per (position, kv head) the head_dim values are int8 codes with one f32
scale, a power of two: shift = 6 - floor(log2(amax)) (clamped to [MIN_SHIFT, MAX_SHIFT]), code =
round_half_even(x * 2^shift) saturated to [-128, 127], scale = 2^-shift (amax 0: codes 0, scale 1). code * scale
is exact in bf16 (at most 8 significant bits), so the cache dequantizes to bf16 without a rounding. A layer's KV8
cache is ONE state of `row_bytes(kv_heads, head_dim)` bytes per position: the K codes (kv_heads*head_dim), the V
codes, the kv_heads K scales (f32), the V scales - so decode attention moves a tile's codes with one DMA and its
scales with another.
"""
from __future__ import annotations

import numpy as np

from kernel_builder.numerics import F32, check_dims, f32_input

MIN_SHIFT, MAX_SHIFT = -64, 100     # external_kernels/kv_quant.cc kMinShift / kMaxShift
SCALE_BYTES = 4                     # one f32 scale per (position, kv head)


def row_bytes(kv_heads: int, head_dim: int) -> int:
    """Bytes of one position's KV8 row: K codes, V codes, K scales, V scales."""
    return 2 * kv_heads * head_dim + 2 * SCALE_BYTES * kv_heads


def split_rows(rows: np.ndarray, kv_heads: int, head_dim: int):
    """KV8 rows (bytes [n, row_bytes]) -> (K codes, V codes) int8 [n, kv_heads*hd], (K, V scales) f32 [n, kv_heads]."""
    w = kv_heads * head_dim
    b = np.ascontiguousarray(np.asarray(rows).view(np.int8).reshape(-1, row_bytes(kv_heads, head_dim)))
    f = np.ascontiguousarray(b[:, 2 * w:]).view(np.float32)
    return b[:, :w], b[:, w:2 * w], f[:, :kv_heads], f[:, kv_heads:]


def pack_rows(k, v, kv_heads: int, head_dim: int) -> np.ndarray:
    """bf16-valued K and V rows [n, kv_heads*hd] -> their KV8 rows (bytes [n, row_bytes])."""
    (kc, ks), (vc, vs) = quantize(k, kv_heads, head_dim), quantize(v, kv_heads, head_dim)
    return np.concatenate([kc, vc, ks.view(np.int8), vs.view(np.int8)], axis=1)


def quantize(x: np.ndarray, kv_heads: int, head_dim: int) -> tuple[np.ndarray, np.ndarray]:
    """bf16-valued x [rows, kv_heads*head_dim] -> (int8 codes of the same shape, f32 scales [rows, kv_heads])."""
    xf = np.asarray(x, dtype=F32).reshape(-1, kv_heads, head_dim)
    amax = np.abs(xf).max(axis=2)
    _, e = np.frexp(amax)                               # amax = m * 2^e, 0.5 <= m < 1: floor(log2) = e - 1
    shift = np.clip(6 - (e - 1), MIN_SHIFT, MAX_SHIFT)
    shift = np.where(amax > 0, shift, 0).astype(np.int32)
    codes = np.clip(np.rint(np.ldexp(xf, shift[:, :, None])), -128, 127).astype(np.int8)
    return codes.reshape(xf.shape[0], -1), np.ldexp(F32(1.0), -shift).astype(F32)


def shifts(scales: np.ndarray) -> np.ndarray:
    """The shifts of f32 scales (2^-shift), read from their exponent bits as the kernels do."""
    bits = np.ascontiguousarray(np.asarray(scales, dtype=np.float32)).view(np.uint32)
    return 127 - ((bits >> 23) & 0xFF).astype(np.int32)


def dequantize(codes: np.ndarray, scales: np.ndarray, kv_heads: int, head_dim: int) -> np.ndarray:
    """int8 codes [rows, kv_heads*head_dim], f32 scales [rows, kv_heads] -> f32 values (exactly bf16): code *
    2^-shift, the shift read from the scale's exponent bits (the kernels' rule; a power-of-two scale is that value)."""
    c = np.asarray(codes, dtype=np.int8).reshape(-1, kv_heads, head_dim).astype(F32)
    sh = shifts(scales).reshape(-1, kv_heads, 1)
    with np.errstate(over="ignore", invalid="ignore"):
        return np.ldexp(c, -sh).astype(F32).reshape(c.shape[0], -1)


def kv_quant(x, kv, *, rows: int, kv_heads: int, head_dim: int, half: int):
    """The writer: x (bf16 K (half 0) or V (half 1) rows [rows, kv_heads*head_dim]) -> the KV8 rows [rows,
    row_bytes] with that half's codes and scales replaced (the other half's bytes kept)."""
    check_dims("kv_quant", rows=rows, kv_heads=kv_heads, head_dim=head_dim)
    if half not in (0, 1):
        raise ValueError(f"kv_quant: half must be 0 (K) or 1 (V), got {half!r}")
    w = kv_heads * head_dim
    xf = f32_input("kv_quant", "x", x, (rows, w))
    codes, sc = quantize(xf, kv_heads, head_dim)
    out = np.array(np.asarray(kv).view(np.int8).reshape(rows, row_bytes(kv_heads, head_dim)), dtype=np.int8)
    out[:, half * w:(half + 1) * w] = codes
    s0 = 2 * w + half * SCALE_BYTES * kv_heads
    out[:, s0:s0 + SCALE_BYTES * kv_heads] = sc.view(np.int8)
    return out
