"""The emulator's decode GEMV on the host CPU: external_kernels/host/gemv_host.cc (loaded by
external_kernels.host_build) reads the bf16 weights as stored. A decode token streams every weight once, and
numpy's BLAS needs them widened to f32: twice the bytes. The emulator hands `gemv` its raw bf16 weight when
this kernel is available (ReferenceExecutor.raw_reads), so a token reads half the memory.

The order is fixed per row (32 partial sums over k, then a fixed tree): a row's result does not depend on the
rows around it or on the thread count. The LM head's GEMV (the only one large enough to pay for a hand-off)
runs its row blocks on kernel_builder.host_threads' pool.
"""
from __future__ import annotations

import numpy as np

from kernel_builder.host_threads import run_items
from kernel_builder.numerics import BF16

PARALLEL_MIN = 1 << 21   # weights below this run on the calling thread (a 135M layer's largest: 0.9M)
ROW_BLOCK = 1024


def run(lib, w: np.ndarray, x: np.ndarray, *, m: int, k: int) -> np.ndarray:
    """f32 y[m] = w[m, k] @ x[k]; w: bf16 [m, k] (contiguous), x: f32 or bf16 [k]; shapes checked by the caller."""
    if w.dtype != BF16 or not w.flags.c_contiguous:
        raise ValueError(f"gemv: the host kernel reads contiguous bf16 weights, got {w.dtype}")
    xf = np.ascontiguousarray(x, dtype=np.float32).reshape(k)
    y = np.empty(m, dtype=np.float32)
    wp, xp, yp = w.ctypes.data, xf.ctypes.data, y.ctypes.data     # plain addresses: w, xf, y outlive the calls

    def rows(r0):
        rc = lib.llama_npu_gemv_bf16(wp, xp, yp, m, k, r0, min(m, r0 + ROW_BLOCK))
        if rc:
            raise ValueError(f"gemv: the host kernel refused m={m}, k={k}")
    run_items(rows, range(0, m, ROW_BLOCK), parallel=m * k >= PARALLEL_MIN)
    return y
