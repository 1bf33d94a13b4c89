"""Host aie_api drivers (kernel_builder.aie_host_runs: `run(obj, rng)`) of the kernels on weights at rest in block
float: the decode GEMV `gemv_bfp` and `gemv_bfp_bias` (external_kernels/gemv_bfp.cc), called the way the builder
calls them (tile_m rows x one K chunk per step, f32 partial sums carried across chunks) on bytes made by
kernel_builder.block_float.encode. Bit exact (bound 0): the vector path, its model and the reference perform the
same block-float rounding of x, exact block dot products and f32 adds in the same order. And RMSNorm with its output
in block float (`rmsnorm_bfp`, external_kernels/rmsnorm_bfp.cc), one tile's calls in the builder's order: its
bf16 values are rmsnorm.cc's (within one bf16 ulp of the reference), so a decoded value is within a few steps of its
group's scale of the reference's (bound 2^-5 max|ref|; tests/test_rmsnorm_bfp.py checks the bytes bit for bit
against block_float.encode of rmsnorm.cc's vector output)."""
from __future__ import annotations

import numpy as np

from kernel_builder import aie_host, block_float
from kernel_builder.aie_host import Run
from kernel_builder.gemv_bfp.external import gemv_bfp_kernel
from kernel_builder.gemv_bfp.reference import gemv_bfp
from kernel_builder.gemv_bfp_bias.reference import gemv_bfp_bias
from kernel_builder.numerics import BF16, to_bf16
from kernel_builder.rmsnorm import bfp_external as rms_bfp
from kernel_builder.rmsnorm.reference import rmsnorm

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


def _rmsnorm_bfp(lib, rng, dim, chunk, blocks, offset=None, xwhole=None):
    sym = rms_bfp.rmsnorm_bfp_kernel(dim, chunk, blocks, offset, xwhole).symbol
    x = to_bf16(rng.standard_normal((8 * blocks, dim)).astype(np.float32) * np.float32(2.0))
    w = to_bf16(rng.standard_normal(dim).astype(np.float32))
    st, yl = A(np.full(rms_bfp.st_elems(blocks), np.nan, np.float32)), A(np.zeros(9 * chunk, np.int8))
    y = np.zeros((blocks, 9 * dim), np.int8)
    counts = None
    # the builder's order: phase -> block -> chunk; an xwhole kernel (blocks 1): phase 1 per chunk on the whole rows
    steps = [(1, 0, c0) for c0 in range(0, dim, chunk)] if xwhole else \
        [(ph, b, c0) for ph in (0, 1) for b in range(blocks) for c0 in range(0, dim, chunk)]
    for phase, b, c0 in steps:
        xs = A(np.ascontiguousarray(x[8 * b:8 * b + 8] if xwhole else x[8 * b:8 * b + 8, c0:c0 + chunk]))
        c = lib.call(sym, xs, A(w[c0:c0 + chunk]), st, yl, 1e-5, phase, b, c0)
        counts = c if phase else counts
        y[b, 9 * c0:9 * (c0 + chunk)] = yl
    want = block_float.decode(rmsnorm(x, w, rows=8 * blocks, dim=dim, eps=1e-5, offset=offset or 0, bfp=1),
                              8 * blocks, dim)
    got = block_float.decode(y, 8 * blocks, dim)
    return Run(got, want, np.full(want.shape, 2.0**-5 * np.abs(want).max()), counts)
