"""Host aie_api drivers (kernel_builder.aie_host_runs: `run(obj, rng)`) of the kernels on weights at rest in block
float: the decode GEMV `gemv_bfp` and `gemv_bfp_bias` (external_kernels/gemv_bfp.cc), called the way the builder
calls them (tile_m rows x one K chunk per step, f32 partial sums carried across chunks) on bytes made by
kernel_builder.block_float.encode. Bit exact (bound 0): the vector path, its model and the reference perform the
same block-float rounding of x, exact block dot products and f32 adds in the same order."""
from __future__ import annotations

import numpy as np

from kernel_builder import aie_host, block_float
from kernel_builder.aie_host import Run
from kernel_builder.gemv_bfp.external import gemv_bfp_kernel
from kernel_builder.gemv_bfp.reference import gemv_bfp
from kernel_builder.gemv_bfp_bias.reference import gemv_bfp_bias
from kernel_builder.numerics import BF16, to_bf16

A = aie_host.aligned


def _gemv_bfp(lib, rng, k, kc, tm, rows, bias=False):
    sym = gemv_bfp_kernel(k, kc, tm, rows, bias).symbol
    wb = block_float.encode(to_bf16(rng.standard_normal((rows, k)).astype(np.float32) * np.float32(0.03)))
    x, b = to_bf16(rng.standard_normal(k).astype(np.float32)), to_bf16(rng.standard_normal(rows).astype(np.float32))
    xa = A(np.concatenate([x, b]) if bias else x)
    acc, y = A(np.full(tm, np.nan, np.float32)), A(np.zeros(rows, BF16))
    counts = None
    for r in range(0, rows, tm):
        for k0 in range(0, k, kc):
            step = np.ascontiguousarray(wb[r // 8:(r + tm) // 8, 9 * k0:9 * (k0 + kc)]).view(np.int8).reshape(-1)
            c = lib.call(sym, A(step), xa, acc, y, r, k0)
            counts = counts or c
    want = (gemv_bfp_bias(wb, x, b, m=rows, k=k) if bias else gemv_bfp(wb, x, m=rows, k=k)).reshape(-1)
    return Run(y, want, np.zeros(want.shape), counts)


def _gemv_bfp_bias(lib, rng, k, kc, tm, rows):
    return _gemv_bfp(lib, rng, k, kc, tm, rows, bias=True)
