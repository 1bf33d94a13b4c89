"""The group-quantized 4-bit weight format (docs/quantization.md): one row-interleaved byte buffer per weight.

A weight of logical shape [M, K] in groups of G along K (G = 32 for GGUF Q4_0/Q4_1 blocks and `--weights q4`,
128 for AWQ/GPTQ) is stored as `u8 [M, row_bytes]`, each row

    codes   K/2 bytes     element 2i in the low nibble of byte i, 2i+1 in the high nibble (aie_api's int4
                          vector lane order: lane 0 in the least significant bits)
    scales  K/G bf16      d[g]
    mins    K/G bf16      m[g]                  (asymmetric formats only)
    pad     to a multiple of 16 bytes (a 128-bit vector load of 32 codes is 16-byte aligned at every group)

and dequantizes to  w[r, k] = bf16( d[g] * q[k] + m[g] )   with q unsigned (0..15), when the format has mins,
                    w[r, k] = bf16( d[g] * q[k] )          with q signed two's-complement (-8..7), when it has none,
(f32 arithmetic, one round-to-nearest-even to bf16: exactly what the AIE2P kernel's vector path computes).
A tile that streams whole rows gets its codes, scales and mins in one contiguous run.

The same layout with `bits=8` holds 8-bit codes (one byte each, int8 without mins: GGUF Q8_0's blocks) in place of
the nibbles and rows padded to 32 bytes (a 256-bit load of 32 codes): the vocabulary matrix a GGUF keeps in Q8_0
runs in it (docs/quantization.md).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kernel_builder.numerics import BF16, to_bf16

ROW_ALIGN = 16          # bytes: a 128-bit vector load of one group's 32 codes (AIE2P alignment rule)
GROUPS = (32, 128)      # GGUF Q4_0/Q4_1 blocks and `--weights q4`; AWQ/GPTQ
BITS = (4, 8)           # 4-bit codes; 8-bit codes (GGUF Q8_0)


@dataclass(frozen=True)
class Q4Layout:
    k: int
    group: int
    mins: bool          # asymmetric (unsigned codes + per-group min) or symmetric (signed codes)
    bits: int = 4

    def __post_init__(self):
        if self.bits not in BITS:
            raise ValueError(f"q4: {self.bits}-bit codes are not one of {BITS}")
        if self.group not in GROUPS:
            raise ValueError(f"q4: group size {self.group} is not one of {GROUPS}")
        if self.k <= 0 or self.k % self.group:
            raise ValueError(f"q4: k={self.k} must be a positive multiple of the group size {self.group}")

    @property
    def groups(self) -> int:
        return self.k // self.group

    @property
    def scale_offset(self) -> int:
        return self.k * self.bits // 8

    @property
    def min_offset(self) -> int:
        return self.scale_offset + 2 * self.groups

    @property
    def used_bytes(self) -> int:
        return self.min_offset + (2 * self.groups if self.mins else 0)

    @property
    def row_bytes(self) -> int:
        align = ROW_ALIGN * self.bits // 4      # one group's 32 codes: 128 bits (4-bit), 256 bits (8-bit)
        return -(-self.used_bytes // align) * align

    def bits_per_weight(self) -> float:
        return 8 * self.row_bytes / self.k


def pack(codes: np.ndarray, scales: np.ndarray, mins: np.ndarray | None, group: int, bits: int = 4) -> np.ndarray:
    """u8 [M, row_bytes] from codes [M, K] (0..15 with mins, -8..7 without; 8 bits: 0..255 / -128..127), scales /
    mins [M, K/G] (any float type; rounded once to bf16 — exact for bf16 or values already representable)."""
    codes = np.asarray(codes)
    m, k = codes.shape
    lay = Q4Layout(k, group, mins is not None, bits)
    top = 1 << bits
    lo, hi = (0, top - 1) if lay.mins else (-top // 2, top // 2 - 1)
    if codes.min(initial=lo) < lo or codes.max(initial=hi) > hi:
        raise ValueError(f"q4: codes outside [{lo}, {hi}]")
    nib = (codes.astype(np.int16) & (top - 1)).astype(np.uint8)
    out = np.zeros((m, lay.row_bytes), dtype=np.uint8)
    out[:, :lay.scale_offset] = nib if bits == 8 else nib[:, 0::2] | (nib[:, 1::2] << 4)
    out[:, lay.scale_offset:lay.min_offset] = _bf16_bytes(scales, (m, lay.groups))
    if lay.mins:
        out[:, lay.min_offset:lay.used_bytes] = _bf16_bytes(mins, (m, lay.groups))
    return out


def _bf16_bytes(a, shape) -> np.ndarray:
    a = np.asarray(a)
    if a.shape != shape:
        raise ValueError(f"q4: scales/mins of shape {list(a.shape)}, expected {list(shape)}")
    b = a if a.dtype == BF16 else to_bf16(a.astype(np.float32))
    return np.ascontiguousarray(b).view(np.uint8).reshape(shape[0], -1)


def unpack(packed: np.ndarray, k: int, group: int, mins: bool, bits: int = 4):
    """(codes int16 [M, K], scales f32 [M, K/G], mins f32 [M, K/G] or None) of a packed buffer."""
    lay = Q4Layout(k, group, mins, bits)
    p = np.asarray(packed, dtype=np.uint8).reshape(-1, lay.row_bytes)
    raw = p[:, :lay.scale_offset]
    codes = np.empty((p.shape[0], k), dtype=np.int16)
    if bits == 8:
        codes[:] = raw
    else:
        codes[:, 0::2] = raw & 0xF
        codes[:, 1::2] = raw >> 4
    if not mins:
        half = 1 << (bits - 1)
        codes = np.where(codes >= half, codes - 2 * half, codes).astype(np.int16)
    s = np.ascontiguousarray(p[:, lay.scale_offset:lay.min_offset]).view(BF16).astype(np.float32)
    z = np.ascontiguousarray(p[:, lay.min_offset:lay.used_bytes]).view(BF16).astype(np.float32) if mins else None
    return codes, s, z


def dequantize(packed: np.ndarray, k: int, group: int, mins: bool, bits: int = 4) -> np.ndarray:
    """bf16 [M, K]: bf16(d*q + m) in f32 (the kernel's dequantization)."""
    codes, s, z = unpack(packed, k, group, mins, bits)
    w = codes.astype(np.float32).reshape(codes.shape[0], -1, group) * s[:, :, None]
    if z is not None:
        w = w + z[:, :, None]
    return to_bf16(w.reshape(codes.shape[0], k))


def quantize_rtn(w: np.ndarray, group: int = 32) -> np.ndarray:
    """Round-to-nearest asymmetric 4-bit quantization per group of `group` along K (`--weights q4`):
    m = min(w), d = bf16((max - min) / 15), q = clip(round((w - m) / d), 0, 15), with the bf16-rounded d and m
    (the values the kernel uses) -> packed u8 [M, row_bytes]."""
    wf = np.asarray(w, dtype=np.float32)
    m, k = wf.shape
    Q4Layout(k, group, True)
    g = wf.reshape(m, k // group, group)
    lo, hi = g.min(axis=2), g.max(axis=2)
    d = to_bf16((hi - lo) / np.float32(15)).astype(np.float32)
    z = to_bf16(lo).astype(np.float32)
    safe = np.where(d > 0, d, np.float32(1))
    q = np.clip(np.rint((g - z[:, :, None]) / safe[:, :, None]), 0, 15).astype(np.int8)
    return pack(q.reshape(m, k), d, z, group)
