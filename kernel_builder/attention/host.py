"""The emulator's attention on the host CPU: external_kernels/host/attention_host.cc (loaded by
external_kernels.host_build), its calls spread over kernel_builder.host_threads' pool.

Why: attention is the one emulated kernel whose work grows with the square of the prompt. numpy has no
fixed-order f32 product (BLAS picks its summation order by matrix shape), so the numpy path
(`reference.attention_numpy`) computes the products in f64 to keep a row's result independent of the chunk
it runs in; at 2k-8k tokens that made attention half or more of an emulated prefill. The C++ kernel does the
arithmetic in f32 in one fixed order per output element (see the comment at the top of the .cc), so a row
still gives the same bits in any chunk and in decode, at several times the speed, on every core. Both paths
agree within bf16 rounding (tested); each is deterministic on its own.
"""
from __future__ import annotations

import ctypes

import numpy as np

from kernel_builder.host_threads import run_items

KEY_TILE = 16       # kv rows are padded to a multiple of this (the kernel's score tile)
ROW_BLOCK = 64      # query rows per work item on the thread pool
PARALLEL_MIN_WORK = 1 << 22   # query rows x keys x query heads below which one thread does it all

_FP = ctypes.POINTER(ctypes.c_float)


def run(lib, qf: np.ndarray, k: np.ndarray, v: np.ndarray, p: int, *, rows: int, heads: int, kv_heads: int,
        head_dim: int, scale: float) -> np.ndarray:
    """f32 attention output [rows, heads*head_dim]. qf: f32 [rows, heads*head_dim]; k, v: [>= p+rows,
    kv_heads*head_dim] (bf16 or f32); the caller has checked the shapes."""
    n = p + rows
    npad = -(-n // KEY_TILE) * KEY_TILE
    kt = np.empty((kv_heads, npad // KEY_TILE, head_dim, KEY_TILE), dtype=np.float32)   # the kernel's layouts
    vt = np.empty((kv_heads, head_dim // KEY_TILE, npad, KEY_TILE), dtype=np.float32)
    kn, vn = (np.ascontiguousarray(x[:n], dtype=np.float32) for x in (k, v))
    if lib.llama_npu_attention_pack(*(a.ctypes.data_as(_FP) for a in (kn, vn)), n, kv_heads, head_dim, npad,
                                    *(a.ctypes.data_as(_FP) for a in (kt, vt))):
        raise ValueError(f"attention: the host kernel refused the K/V shapes ({n} positions, {kv_heads} kv heads, "
                         f"head_dim {head_dim})")
    q = np.ascontiguousarray(qf, dtype=np.float32)
    out = np.empty((rows, heads * head_dim), dtype=np.float32)
    args = [a.ctypes.data_as(_FP) for a in (q, kt, vt, out)]
    # later rows see more keys: hand them out first so the workers finish together
    items = [(h, r0, min(rows, r0 + ROW_BLOCK)) for r0 in reversed(range(0, rows, ROW_BLOCK))
             for h in range(kv_heads)]

    def one(item):
        h, r0, r1 = item
        rc = lib.llama_npu_attention(*args, rows, p, heads, kv_heads, head_dim, npad, scale, h, r0, r1)
        if rc == -1:
            raise MemoryError(f"attention: the host kernel could not allocate its {npad}-key work buffer")
        if rc:
            raise ValueError(f"attention: the host kernel refused the shapes (rows {rows}, position {p}, heads "
                             f"{heads}/{kv_heads}, head_dim {head_dim}, kv head {h}, rows {r0}..{r1})")

    run_items(one, items, parallel=rows * n * heads >= PARALLEL_MIN_WORK)
    nan = np.isnan(out)                   # which NaN an add keeps (sign, payload) is up to the compiler:
    if nan.any():                         # one canonical NaN, so both builds give the same bits
        out[nan] = np.nan
    return out
