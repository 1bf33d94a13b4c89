"""The `dequant_q4` kernel's external C++ kernel (external_kernels/dequant_q4.cc): shapes and symbols, the numpy
model of its portable path for the interpreter, and its cost descriptor (counted formula, same style as
gemv_q4's); FAMILY and COSTS register them with the kernel spec."""
from __future__ import annotations

import re

import numpy as np

from external_kernels.compile_rules import ExternalKernel
from kernel_builder.external_costs import DEFAULT_STACK, CallWork, ExternalCost
from kernel_builder.external_models import need_memref
from kernel_builder.externals import ExternalFamily, check_multiple
from kernel_builder.gemv_q4.format import Q4Layout, dequantize
from kernel_builder.hw.facts import NPU2
from kernel_builder.instr_counts import Counts, add_acc, conv, load, store, vmac
from kernel_builder.planner import check_positive

DQ4_K_MULTIPLE = NPU2.vector_lanes_bf16   # one int4 vector of 32 lanes -> 32 bf16 lanes per step


def dequant_q4_kernel(k: int, group: int, mins: int, tile_m: int) -> ExternalKernel:
    """`(w u8[tile_m * row_bytes], y bf16[tile_m * k])`: tile_m whole q4 rows dequantized to bf16 rows."""
    check_positive("dequant_q4", k=k, tile_m=tile_m)
    check_multiple("dequant_q4", "k", k, DQ4_K_MULTIPLE)
    lay = Q4Layout(k, group, bool(mins))
    tag = f"k{k}_g{group}_z{int(mins)}_m{tile_m}"
    symbol = f"dqq4_bf16_{tag}"
    return ExternalKernel(
        symbol=symbol, obj=f"dqq4_{tag}.o", source="dequant_q4.cc",
        defines=(("DQ4_K", str(k)), ("DQ4_G", str(group)), ("DQ4_MINS", str(int(mins))),
                 ("DQ4_TILE_M", str(tile_m)), ("DQ4_RB", str(lay.row_bytes)), ("DQ4_SYMBOL", symbol)))


def dequant_q4_model(k: int, group: int, mins: int, tm: int):
    lay = Q4Layout(k, group, bool(mins))

    def dq(w, y):
        wb = need_memref(w, "w", tm * lay.row_bytes, "i8")
        out = need_memref(y, "y", tm * k)
        out[:] = dequantize(wb.view(np.uint8), k, group, bool(mins)).reshape(-1)
        y.written = True
    return dq


def _dequant_q4(m, args):
    """Counted formula of dequant_q4.cc's vector path (checked against the host aie_api in
    tests/test_dequant_q4.py): per 32 weights a 16-byte code load, unpack, to_float (2 conversions + 2 accumulator
    adds), d*q (a mac-unit multiply), with mins the add of the broadcast min (a widening + an add), the RNE
    conversion to bf16 and a 64-byte store; per group with mins one broadcast."""
    k, group, mins, tm = int(m.group(1)), int(m.group(2)), int(m.group(3)), int(m.group(4))
    per32 = (load(16, 1) + Counts(unpack=1) + conv(2) + add_acc(2) + vmac(32) + conv() + store(32, 2)
             + (conv() + add_acc() if mins else Counts()))
    row = (k // 32) * per32 + (k // group) * Counts(broadcast=int(mins))
    return CallWork(0, 0, row * tm)


FAMILY = ExternalFamily("dequant_q4", "dequant_q4.cc", r"dqq4_k(\d+)_g(\d+)_z(\d)_m(\d+)\.o",
                        r"dqq4_bf16_k(\d+)_g(\d+)_z(\d)_m(\d+)", dequant_q4_kernel, dequant_q4_model)
COSTS = (
    # dequant_q4(w, y): writes y only
    ExternalCost("dequant_q4", re.compile(FAMILY.symbol_re), _dequant_q4, DEFAULT_STACK, (1,), ()),
)
