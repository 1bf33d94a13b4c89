"""The `gemv_q4` kernel's external C++ kernel (external_kernels/gemv_q4.cc): shapes and symbols, the numpy model
of its portable path for the interpreter, and its cost descriptor (same style as kernel_builder/gemv/external.py,
so either cost model prices it); FAMILY and COSTS register them with the kernel spec."""
from __future__ import annotations

import re

import numpy as np

from external_kernels.compile_rules import ExternalKernel
from kernel_builder.external_costs import DEFAULT_STACK, CallWork, ExternalCost
from kernel_builder.external_models import F32, ModelError, need_memref, seq_sum
from kernel_builder.externals import ExternalFamily, check_multiple
from kernel_builder.gemv_q4.format import Q4Layout, dequantize
from kernel_builder.hw.facts import NPU2
from kernel_builder.instr_counts import Counts, add_acc, conv, load, scalar_bf16, vmac
from kernel_builder.numerics import to_bf16
from kernel_builder.planner import check_positive

Q4_K_MULTIPLE = NPU2.vector_lanes_bf16   # one int4 vector of 32 lanes -> 32 bf16 lanes per step of the vector path


def gemv_q4_kernel(k: int, group: int, mins: int, tile_m: int, rows: int, bits: int | None = 4,
                   bias: bool = False, swiglu: bool = False) -> ExternalKernel:
    """One 4-bit GEMV step of a herd tile: `(w u8[tile_m * row_bytes], x bf16[k], y bf16[rows], int32 row)`:
    tile_m whole rows in the q4 row layout (format.Q4Layout), dequantized in the core, f32 accumulation.
    bits=8: the same with 8-bit codes (symbol and object end in `_b8`). `bias` (kernel_builder.gemv_q4_bias): x
    holds k + rows elements, the tile's bias rows after the input, added to each row's f32 sum before the
    rounding (`mvq4b_bf16_...`, -DQ4_BIAS=1)."""
    bits = bits or 4
    check_positive("gemv_q4", k=k, tile_m=tile_m, rows=rows)
    check_multiple("gemv_q4", "k", k, Q4_K_MULTIPLE)
    lay = Q4Layout(k, group, bool(mins), bits)
    if rows % tile_m:
        raise ValueError(f"gemv_q4: tile_m={tile_m} must divide rows={rows}")
    tag = f"k{k}_g{group}_z{int(mins)}_m{tile_m}_r{rows}" + ("_b8" if bits == 8 else "")
    base = "mvq4s" if swiglu else "mvq4b" if bias else "mvq4"
    symbol = f"{base}_bf16_{tag}"
    kern = ExternalKernel(
        symbol=symbol, obj=f"{base}_{tag}.o", source="gemv_q4.cc",
        defines=(("Q4_K", str(k)), ("Q4_G", str(group)), ("Q4_MINS", str(int(mins))), ("Q4_TILE_M", str(tile_m)),
                 ("Q4_ROWS", str(rows)), ("Q4_RB", str(lay.row_bytes)), ("Q4_SYMBOL", symbol))
        + ((("Q4_BITS", "8"),) if bits == 8 else ()) + ((("Q4_BIAS", "1"),) if bias else ()))
    if swiglu:       # gemv_q4_swiglu: the object's second entry, the SwiGLU of the tile's gate and up rows
        if rows % 2:
            raise ValueError(f"gemv_q4_swiglu: rows={rows} must be even (gate rows then up rows)")
        kern = ExternalKernel(symbol=symbol, obj=kern.obj, source=kern.source,
                              defines=kern.defines + (("Q4_SWIGLU_SYMBOL", swiglu_symbol(kern)),))
    return kern


def swiglu_symbol(kern: ExternalKernel) -> str:
    """The SwiGLU entry of a gemv_q4_swiglu object (`mvq4a_bf16_...`, beside its GEMV step `mvq4s_bf16_...`)."""
    return kern.symbol.replace("mvq4s_", "mvq4a_", 1)


def gemv_q4_model(k: int, group: int, mins: int, tm: int, rows: int, bits: int | None = 4, bias: bool = False):
    bits = bits or 4
    lay = Q4Layout(k, group, bool(mins), bits)

    def mv(w, x, y, row):
        wb = need_memref(w, "w", tm * lay.row_bytes, "i8")
        xs = need_memref(x, "x", k + rows * bias)
        out = need_memref(y, "y", rows)
        r = int(row)
        if not (0 <= r and r + tm <= rows and r % tm == 0):
            raise ModelError(f"row offset {r} is not a tile_m={tm} block of the {rows} output rows")
        wf = dequantize(wb.view(np.uint8), k, group, bool(mins), bits).astype(F32)
        s = seq_sum(wf * xs[:k].astype(F32)[None, :], np.zeros(tm, dtype=F32))
        out[r:r + tm] = to_bf16((s + xs[k + r:k + r + tm].astype(F32)).astype(F32) if bias else s)
        y.written = True
    return mv


def _gemv_q4(m, args, bias: bool = False):
    """Counted formula of gemv_q4.cc's vector path (checked against the host aie_api in tests/test_gemv_q4.py):
    per 32 weights a 16-byte code load and a 64-byte x load, unpack, to_float (2 conversions + 2 accumulator
    adds), d*q (a mac-unit multiply), with mins the add of the broadcast min (a widening + an add), the RNE
    conversion to bf16 and the mac; per group with mins one broadcast; per row a conversion, a reduce_add and the
    scalar bf16 rounding of y."""
    k, group, mins, tm = int(m.group(1)), int(m.group(2)), int(m.group(3)), int(m.group(4))
    codes = load(32, 1) if m.group(6) else load(16, 1) + Counts(unpack=1)    # 8-bit codes: no unpack
    per32 = (codes + load(32, 2) + conv(2) + add_acc(2) + vmac(32) * 2 + conv()
             + (conv() + add_acc() if mins else Counts()))
    row = (k // 32) * per32 + (k // group) * Counts(broadcast=int(mins)) + conv() + Counts(reduce_add=1) \
        + scalar_bf16(1)
    return CallWork(k * tm, (2 + bias) * tm, row * tm)   # the bias: one scalar f32 add per row


FAMILY = ExternalFamily("gemv_q4", "gemv_q4.cc", r"mvq4_k(\d+)_g(\d+)_z(\d)_m(\d+)_r(\d+)(?:_b(8))?\.o",
                        r"mvq4_bf16_k(\d+)_g(\d+)_z(\d)_m(\d+)_r(\d+)(?:_b(8))?", gemv_q4_kernel, gemv_q4_model)
COSTS = (
    # gemv_q4(w, x, y, row): writes y only
    ExternalCost("gemv_q4", re.compile(FAMILY.symbol_re), _gemv_q4, DEFAULT_STACK, (2,), ()),
)
