"""The `dequant_q4` kernel's external C++ kernel (external_kernels/dequant_q4.cc): shapes and symbols, the numpy
model of its portable path for the interpreter and its cost descriptor; FAMILY and COSTS register them."""
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

DQ_K_MULTIPLE = NPU2.vector_lanes_bf16   # one int4 vector of 32 lanes per step


def dequant_q4_kernel(k: int, group: int, mins: int, rows: int) -> ExternalKernel:
    """(w u8[rows * row_bytes], y bf16[rows * k]): whole rows in the q4 row layout, dequantized as gemv_q4 does."""
    check_positive("dequant_q4", k=k, rows=rows)
    check_multiple("dequant_q4", "k", k, DQ_K_MULTIPLE)
    lay = Q4Layout(k, group, bool(mins))
    tag = f"k{k}_g{group}_z{int(mins)}_r{rows}"
    symbol = f"dq4_bf16_{tag}"
    return ExternalKernel(symbol=symbol, obj=f"dq4_{tag}.o", source="dequant_q4.cc",
                          defines=(("DQ_K", str(k)), ("DQ_G", str(group)), ("DQ_MINS", str(int(mins))),
                                   ("DQ_ROWS", str(rows)), ("DQ_RB", str(lay.row_bytes)), ("DQ_SYMBOL", symbol)))


def dequant_q4_model(k: int, group: int, mins: int, rows: int):
    lay = Q4Layout(k, group, bool(mins))

    def dq(w, y):
        wb = need_memref(w, "w", rows * lay.row_bytes, "i8")
        need_memref(y, "y", rows * k)[:] = dequantize(wb.view(np.uint8).reshape(rows, -1), k, group,
                                                      bool(mins)).reshape(-1)
        y.written = True
    return dq


def _dequant_q4(m, args):
    """Counted formula of dequant_q4.cc's vector path: per 32 weights a 16-byte code load, unpack, to_float (2
    conversions + 2 accumulator adds), d*q (a mac-unit multiply), with mins the add of the broadcast min (a
    widening + an add), the RNE conversion to bf16 and a 64-byte store; per group with mins one broadcast."""
    k, group, mins, rows = (int(g) for g in m.groups())
    per32 = (load(16, 1) + Counts(unpack=1) + conv(2) + add_acc(2) + vmac(32) + conv() + store(32, 2)
             + (conv() + add_acc() if mins else Counts()))
    row = (k // 32) * per32 + (k // group) * Counts(broadcast=int(mins))
    return CallWork(k * rows, 0, row * rows)


FAMILY = ExternalFamily("dequant_q4", "dequant_q4.cc", r"dq4_k(\d+)_g(\d+)_z(\d)_r(\d+)\.o",
                        r"dq4_bf16_k(\d+)_g(\d+)_z(\d)_r(\d+)", dequant_q4_kernel, dequant_q4_model)
COSTS = (ExternalCost("dequant_q4", re.compile(FAMILY.symbol_re), _dequant_q4, DEFAULT_STACK, (1,), (1,)),)
