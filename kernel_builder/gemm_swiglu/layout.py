"""The `gemm_swiglu` kernel's weight layout: ONE [2n, k] weight holding the gate and the up projection's rows
interleaved by 8-row blocks (rows 16q .. 16q+7 = gate rows 8q .. 8q+7, rows 16q+8 .. 16q+15 = up rows 8q .. 8q+7).

Why: a herd column's W panel must be filled by ONE L3 DMA. Two DMAs (gate rows, up rows) give the panel two S2MM
channels, and mlir-air's memory-tile placement (AIRToAIEPass.cpp L2MemrefToMemTileMap: column affinity puts each
herd row's A panel and C row panel, 1 + herd_n S2MM, on its column's memory tile) then leaves no tile with room
for it (1 + 4 + 2 > 6). Concatenating the two weights ([gate; up]) keeps one DMA but its gate -> up stride (n*k
elements) exceeds the shim BD's 20-bit step at hidden 2048, ffn 8192. Interleaved by 8, the tile computing outputs
[c0, c0 + t) reads the contiguous rows [2*c0, 2*c0 + 2t): the plain GEMM's W panel, and the 8x8 blocks its mac
takes alternate gate, up, so the epilogue pairs accumulator column blocks 2q, 2q+1 (external_kernels/gemm.cc glu).

The values are the checkpoint's: a row permutation done once at load, one device copy (the decode GEMV reads the
same buffer as one [2n, k] matrix and its SwiGLU launch takes the pairs apart: kernel_builder/swiglu, `pairs`).
"""
from __future__ import annotations

import numpy as np

PAIR = 8   # rows per gate (and per up) block: the micro-kernel's 8x8 block edge


def interleave_index(n: int) -> np.ndarray:
    """Row i of the interleaved [2n, k] weight is row index[i] of the concatenation [gate; up] ([2n, k])."""
    if n % PAIR:
        raise ValueError(f"gemm_swiglu layout: n={n} is not a multiple of {PAIR}")
    q = np.arange(n // PAIR)[:, None, None]
    half = np.arange(2)[None, :, None]
    r = np.arange(PAIR)[None, None, :]
    return (half * n + q * PAIR + r).reshape(-1)


def interleave(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    """The [2n, ...] interleaved weight (or output row) of gate [n, ...] and up [n, ...]."""
    return np.concatenate([gate, up])[interleave_index(gate.shape[0])]


def split(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(gate, up) of an interleaved [2n, ...] array (the inverse of interleave)."""
    blocks = w.reshape(w.shape[0] // (2 * PAIR), 2, PAIR, *w.shape[1:])
    n = w.shape[0] // 2
    return blocks[:, 0].reshape(n, *w.shape[1:]), blocks[:, 1].reshape(n, *w.shape[1:])
