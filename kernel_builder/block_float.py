"""Weights at rest in block float: the bfp16ebs8 byte layout the AIE2P block-float matrix unit reads.

A weight w[n, k] (the Hugging Face [out, in] layout) is stored as 8x8 blocks, block-row major:

    bytes [n/8, 9k]   block (nb, kb) at bytes [nb, 72*kb : 72*kb + 72]
    inside a block:   row r (0..7) at byte 9*r: [E, m0 .. m7]  for w[8nb + r, 8kb .. 8kb + 7]
    value             m_i * 2^(E - 127 - 6)   (E: unsigned biased exponent, m_i: two's complement int8)

That is the layout of AMD's own host converter for bfp16ebs8 operands (mlir-aie programming_examples/ml/
block_datatypes/helper.h, `floatToBfp16` with block 8 and the 8x8 sub-tile shuffle that makes one sub-tile 72
contiguous bytes): one 72-byte block is one v64bfp16ebs8, eight groups of 8 values along k sharing one exponent,
which is the [N][K] operand `mac_8x8_8x8T` takes as stored. 9 bits per weight instead of 16.

Rounding (done once, on the host, at load): each group of 8 shares the exponent e of its largest magnitude and
keeps m = round-half-even(x / 2^(e-6)) clipped to [-128, 127] (kernel_builder.numerics.to_bfp16ebs8, the model the
in-core conversion of external_kernels/gemm.cc follows), so a GEMM on these weights multiplies the very values the
bf16 path's vector micro-kernel converts its W tiles to. Exponents below -127 (groups whose largest magnitude is
under 2^-127) are raised to -127: their mantissas round to what remains, tiny values to 0; an all-zero group
has E = 0. Every decoded value is
a bf16 value (at most 8 significant bits).
"""
from __future__ import annotations

import numpy as np

BLOCK = 8                    # edge of one block (8 rows x 8 values along k)
GROUP_BYTES = 1 + BLOCK      # one exponent byte + 8 mantissa bytes
BLOCK_BYTES = BLOCK * GROUP_BYTES   # 72: one v64bfp16ebs8
EXP_BIAS = 127
_MIN_E, _MAX_E = -EXP_BIAS, 255 - EXP_BIAS
_ENCODE_STEP = 1024          # rows converted per step (bounds the float32 temporaries to ~1024 * k * 12 bytes)


def row_bytes(k: int) -> int:
    """Bytes of one block row (8 weight rows) of k columns."""
    _check(8, k)
    return k // BLOCK * BLOCK_BYTES


def shape(n: int, k: int) -> tuple[int, int]:
    """The at-rest array's shape for w[n, k]: [n/8, 9k] bytes."""
    _check(n, k)
    return n // BLOCK, row_bytes(k)


def _check(n: int, k: int) -> None:
    if n <= 0 or k <= 0 or n % BLOCK or k % BLOCK:
        raise ValueError(f"block float weights: shape [{n}, {k}] must be positive multiples of {BLOCK} "
                         f"(8x8 blocks)")


def _groups(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Exponents e [rows, k/8] and int8 mantissas [rows, k/8, 8] of rows of f32 values."""
    g = x.reshape(x.shape[0], -1, BLOCK)
    if not np.isfinite(g).all():
        raise ValueError("block float weights: the weight holds inf or NaN")
    amax = np.abs(g).max(axis=-1)
    e = np.frexp(amax)[1].astype(np.int32) - 1            # floor(log2(amax)); frexp(0) gives 0 -> e = -1
    e = np.clip(np.where(amax > 0, e, _MIN_E), _MIN_E, _MAX_E)    # an all-zero group: E = 0, as AMD's converter
    m = np.clip(np.rint(np.ldexp(g, (6 - e)[..., None])), -128, 127).astype(np.int8)   # rint: ties to even
    return e, m


def encode(w) -> np.ndarray:
    """w[n, k] (bf16 / float32 / float64 values) -> the at-rest bytes [n/8, 9k] (uint8)."""
    w = np.asarray(w)
    if w.ndim != 2:
        raise ValueError(f"block float weights: expected a 2-D [out, in] weight, got shape {w.shape}")
    n, k = w.shape
    _check(n, k)
    out = np.empty(shape(n, k), dtype=np.uint8)
    view = out.reshape(n // BLOCK, k // BLOCK, BLOCK, GROUP_BYTES)    # [nb, kb, r, 9]
    for r0 in range(0, n, _ENCODE_STEP):
        rows = np.asarray(w[r0:r0 + _ENCODE_STEP], dtype=np.float32)
        e, m = _groups(rows)                                  # [rows, kb], [rows, kb, 8]
        nb0, nbs = r0 // BLOCK, rows.shape[0] // BLOCK
        blk = view[nb0:nb0 + nbs]                              # [nbs, kb, 8, 9]
        e4 = (e + EXP_BIAS).astype(np.uint8).reshape(nbs, BLOCK, -1).transpose(0, 2, 1)
        m4 = m.view(np.uint8).reshape(nbs, BLOCK, -1, BLOCK).transpose(0, 2, 1, 3)
        blk[..., 0] = e4
        blk[..., 1:] = m4
    return out


def decode(b, n: int, k: int) -> np.ndarray:
    """The at-rest bytes [n/8, 9k] -> w[n, k] as float32 (exact: every value is a bf16 value)."""
    b = np.asarray(b)
    if b.dtype not in (np.uint8, np.int8) or b.size != n * k * GROUP_BYTES // BLOCK:
        raise ValueError(f"block float weights: expected {n * k * GROUP_BYTES // BLOCK} bytes (uint8) for "
                         f"[{n}, {k}], got {b.size} of {b.dtype}")
    _check(n, k)
    v = b.view(np.uint8).reshape(n // BLOCK, k // BLOCK, BLOCK, GROUP_BYTES)
    e = v[..., 0].astype(np.int32) - EXP_BIAS - 6                     # [nb, kb, r]
    m = v[..., 1:].view(np.int8).astype(np.float32)                   # [nb, kb, r, 8]
    vals = np.ldexp(m, e[..., None])                                  # exact (2^-133 is a float32 subnormal)
    return vals.transpose(0, 2, 1, 3).reshape(n, k)


def quantize(w) -> np.ndarray:
    """The values the at-rest format keeps of w[n, k] (float32): decode(encode(w))."""
    w = np.asarray(w)
    return decode(encode(w), *w.shape)
