"""numpy reference of the `gemm` kernel (GEMM) with NPU numerics (kernel_builder.reference has the
contract: bf16 inputs, f32 arithmetic, one bf16 round-to-nearest-even on the output)."""
from __future__ import annotations

import numpy as np

from kernel_builder.host_threads import run_items
from kernel_builder.numerics import F32, check_dims, f32_input, to_bf16

# Rows per BLAS call in gemm: every call has the same shape, so a row's result never depends on m.
_GEMM_ROW_BLOCK = 64
_GEMM_PARALLEL_MIN_MACS = 1 << 24   # below this a GEMM runs on the calling thread (pool hand-off ~0.1 ms)


def gemm(a, w, *, m: int, k: int, n: int) -> np.ndarray:
    return to_bf16(gemm_f32(a, w, m=m, k=k, n=n))


def gemm_f32(a, w, *, m: int, k: int, n: int) -> np.ndarray:
    """c[m, n] = a[m, k] @ w[n, k]^T (w in the Hugging Face [out, in] layout, like gemv), f32 accumulation,
    one bf16 rounding.

    BLAS sgemm picks its micro-kernel (and so the summation order) by matrix height, so a plain `a @ w.T`
    would make a prompt row's result depend on the prefill bucket. On the NPU a row's accumulation order is
    fixed by the tiling, never by the other rows; computing in fixed 64-row blocks (zero-padded) restores
    that row independence (padding invariance is bit-exact, tested) at f32 speed. Large GEMMs run their blocks
    on the emulator's thread pool (kernel_builder.host_threads): the same calls, so the same bits.
    """
    check_dims("gemm", m=m, k=k, n=n)
    af = f32_input("gemm", "a", a, (m, k))
    wt = f32_input("gemm", "w", w, (n, k)).T  # a view: BLAS reads the [n, k] rows as the transposed operand
    blk = _GEMM_ROW_BLOCK
    padded = -(-m // blk) * blk
    if padded != m:
        af = np.concatenate([af, np.zeros((padded - m, k), dtype=F32)])
    c = np.empty((padded, n), dtype=F32)

    def block(r):
        np.matmul(af[r:r + blk], wt, out=c[r:r + blk])
    # the blocks are independent calls of one shape: on the emulator's pool they give the same bits
    run_items(block, range(0, padded, blk), parallel=padded * k * n >= _GEMM_PARALLEL_MIN_MACS)
    return c[:m]
