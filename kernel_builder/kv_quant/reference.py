"""numpy reference of the `kv_quant` kernel (the KV8 cache writer) and the KV8 format's (de)quantization, shared by
the decode attention over the int8 cache (kernel_builder/attention_kv8) and the host side.

Format (docs/quantization.md "KV cache"): per (position, kv head) the head_dim values are int8 codes with one f32
scale, a power of two: shift = 6 - floor(log2(amax)) (clamped to [MIN_SHIFT, MAX_SHIFT]), code =
round_half_even(x * 2^shift) saturated to [-128, 127], scale = 2^-shift (amax 0: codes 0, scale 1). code * scale
is exact in bf16 (at most 8 significant bits), so the cache dequantizes to bf16 without a rounding. A layer's KV8
cache is ONE state of `row_bytes(kv_heads, head_dim)` bytes per position: per kv head one block of
`block_bytes(head_dim)` = its K codes, its V codes, its K scale (f32), its V scale - so the blocks of the kv heads a
decode launch reads are one contiguous run per position (one DMA moves codes and scales).
"""
from __future__ import annotations

import numpy as np

from kernel_builder.numerics import F32, check_dims, f32_input

MIN_SHIFT, MAX_SHIFT = -64, 100     # external_kernels/kv_quant.cc kMinShift / kMaxShift
SCALE_BYTES = 4                     # one f32 scale per (position, kv head)


def block_bytes(head_dim: int) -> int:
    """Bytes of one (position, kv head) block: K codes, V codes, K scale, V scale."""
    return 2 * head_dim + 2 * SCALE_BYTES


def row_bytes(kv_heads: int, head_dim: int) -> int:
    """Bytes of one position's KV8 row: kv_heads blocks."""
    return kv_heads * block_bytes(head_dim)


def split_rows(rows: np.ndarray, kv_heads: int, head_dim: int):
    """KV8 rows (bytes [n, row_bytes]) -> (K codes, V codes) int8 [n, kv_heads*hd], (K, V scales) f32 [n, kv_heads]."""
    hd = head_dim
    b = np.ascontiguousarray(np.asarray(rows).view(np.int8).reshape(-1, kv_heads, block_bytes(hd)))
    n = b.shape[0]
    f = np.ascontiguousarray(b[:, :, 2 * hd:]).view(np.float32)            # [n, kv_heads, 2]
    return (b[:, :, :hd].reshape(n, -1), b[:, :, hd:2 * hd].reshape(n, -1), np.ascontiguousarray(f[:, :, 0]),
            np.ascontiguousarray(f[:, :, 1]))


def pack_rows(k, v, kv_heads: int, head_dim: int) -> np.ndarray:
    """bf16-valued K and V rows [n, kv_heads*hd] -> their KV8 rows (bytes [n, row_bytes])."""
    (kc, ks), (vc, vs) = quantize(k, kv_heads, head_dim), quantize(v, kv_heads, head_dim)
    n, hd = kc.shape[0], head_dim
    blocks = [kc.reshape(n, kv_heads, hd), vc.reshape(n, kv_heads, hd), ks.view(np.int8).reshape(n, kv_heads, 4),
              vs.view(np.int8).reshape(n, kv_heads, 4)]
    return np.concatenate(blocks, axis=2).reshape(n, row_bytes(kv_heads, hd))


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
    hd = head_dim
    xf = f32_input("kv_quant", "x", x, (rows, kv_heads * hd))
    codes, sc = quantize(xf, kv_heads, hd)
    out = np.array(np.asarray(kv).view(np.int8).reshape(rows, kv_heads, block_bytes(hd)), dtype=np.int8)
    out[:, :, half * hd:(half + 1) * hd] = codes.reshape(rows, kv_heads, hd)
    s0 = 2 * hd + half * SCALE_BYTES
    out[:, :, s0:s0 + SCALE_BYTES] = sc.view(np.int8).reshape(rows, kv_heads, SCALE_BYTES)
    return out.reshape(rows, -1)
