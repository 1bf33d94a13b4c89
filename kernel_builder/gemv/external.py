"""The `gemv` kernel's external C++ kernel (external_kernels/gemv.cc): its shapes and symbols
(ExternalKernel), its numpy model for the interpreter (the .cc's portable path) and its cost/resource
descriptor for the hardware model; FAMILY and COSTS register them with the kernel spec."""
from __future__ import annotations

import re

import numpy as np

from external_kernels.compile_rules import ExternalKernel
from kernel_builder.external_costs import DEFAULT_STACK, CallWork, ExternalCost
from kernel_builder.instr_counts import Counts, add_acc, conv, load, scalar_bf16, vmac
from kernel_builder.external_models import F32, ModelError, need_memref, seq_sum
from kernel_builder.externals import ExternalFamily, check_multiple
from kernel_builder.hw.facts import NPU2
from kernel_builder.numerics import to_bf16
from kernel_builder.planner import check_positive

# Vector-path granularity: the AIE2P kernels work on 32-lane bf16 vectors (16 lanes for the RoPE halves), so
# shapes must be multiples of these. Checked here so a bad shape fails at build time with a clear message.
GEMV_K_MULTIPLE = NPU2.vector_lanes_bf16   # the AIE2P 32-lane bf16 vector path


def gemv_kernel(k: int, kc: int, tile_m: int, rows: int, bias: bool = False) -> ExternalKernel:
    """One GEMV step of a herd tile: rows [row, row+tile_m) of its `rows` outputs, K chunk [k0, k0+kc):
    `(w[tile_m][kc], x[k], acc[tile_m] f32, y[rows], int32 row, int32 k0)` (x whole: the step reads
    x[k0, k0+kc)); partial sums carried in `acc` across the k/kc chunks, the last chunk writes bf16 RNE into y.
    f32 accumulation. `bias` (kernel_builder.gemv_bias): x holds k + rows elements, the tile's bias rows b after
    the input, and the last chunk adds b[row + m] to the f32 sum before the rounding (symbol `mvb_bf16_...`,
    -DGEMV_BIAS=1)."""
    check_positive("gemv", k=k, kc=kc, tile_m=tile_m, rows=rows)
    check_multiple("gemv", "k", k, GEMV_K_MULTIPLE)
    check_multiple("gemv", "kc", kc, GEMV_K_MULTIPLE)
    if k % kc:
        raise ValueError(f"gemv: kc={kc} must divide k={k}")
    if rows % tile_m:
        raise ValueError(f"gemv: tile_m={tile_m} must divide rows={rows}")
    tag, base = f"k{k}_c{kc}_m{tile_m}_r{rows}", "mvb" if bias else "mv"
    symbol = f"{base}_bf16_{tag}"
    return ExternalKernel(
        symbol=symbol,
        obj=f"{base}_{tag}.o",
        source="gemv.cc",
        defines=(("GEMV_K", str(k)), ("GEMV_KC", str(kc)), ("GEMV_TILE_M", str(tile_m)), ("GEMV_ROWS", str(rows)),
                 ("GEMV_SYMBOL", symbol), *((("GEMV_BIAS", "1"),) if bias else ())),
    )


def gemv_model(k: int, kc: int, tm: int, rows: int, bias: bool = False):
    def mv(w, x, acc, y, row, k0):
        wf = need_memref(w, "w", tm * kc).reshape(tm, kc).astype(F32)
        xs = need_memref(x, "x", k + rows * bias)
        a = need_memref(acc, "acc", tm, "f32")
        out = need_memref(y, "y", rows)
        r, c0 = int(row), int(k0)
        if not (0 <= r and r + tm <= rows and r % tm == 0):
            raise ModelError(f"row offset {r} is not a tile_m={tm} block of the {rows} output rows")
        if not (0 <= c0 < k and c0 % kc == 0):
            raise ModelError(f"k offset {c0} is not a kc={kc} chunk of k={k}")
        if c0 > 0 and not acc.written:
            raise ModelError("a later K chunk reads the f32 partial sums before any chunk wrote them")
        init = np.zeros(tm, dtype=F32) if c0 == 0 else a.astype(F32)
        s = seq_sum(wf * xs[c0:c0 + kc].astype(F32), init)
        if c0 + kc >= k:
            if bias:
                s = (s + xs[k + r:k + r + tm].astype(F32)).astype(F32)
            out[r:r + tm] = to_bf16(s)
            y.written = True
        else:
            a[:] = s
            acc.written = True
    return mv


def _gemv(m, args, bias: bool = False):
    k, kc, tm = int(m.group(1)), int(m.group(2)), int(m.group(3))
    k0 = args[5] if len(args) > 5 and isinstance(args[5], int) else None
    last = (k0 + kc >= k) if k0 is not None else kc / k   # unknown chunk: the share of last chunks
    # per row (gemv.cc): kc/32 macs, each on a w and an x load; add of the two accumulators, to f32, reduce_add;
    # the last K chunk rounds each row to bf16 (a scalar conversion)
    row = (kc // 32) * (load(32, 2) * 2 + vmac(32)) + add_acc() + conv() + Counts(reduce_add=1) + scalar_bf16(last)
    # the bias epilogue (last chunk): one more scalar f32 add per row (the bf16 -> f32 widening is a shift)
    return CallWork(kc * tm, (2 + bias * last) * tm, row * tm)


FAMILY = ExternalFamily("gemv", "gemv.cc", r"mv_k(\d+)_c(\d+)_m(\d+)_r(\d+)\.o", r"mv_bf16_k(\d+)_c(\d+)_m(\d+)_r(\d+)",
                        gemv_kernel, gemv_model)
COSTS = (
    # gemv(w, x, acc, y, row, k0): writes acc (partial sums, read back by later K chunks) and y
    ExternalCost("gemv", re.compile(FAMILY.symbol_re), _gemv, DEFAULT_STACK, (2, 3), (3,)),
)
