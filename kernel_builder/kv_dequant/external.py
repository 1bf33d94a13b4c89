"""The `kv_dequant` kernel's external C++ kernel (external_kernels/kv_dequant.cc): shapes and symbols, the numpy
model of its portable path, and its counted cost; FAMILY and COSTS register them with the kernel spec."""
from __future__ import annotations

import re

import numpy as np

from external_kernels.compile_rules import ExternalKernel
from kernel_builder.external_costs import DEFAULT_STACK, CallWork, ExternalCost
from kernel_builder.external_models import need_memref
from kernel_builder.externals import ExternalFamily, check_multiple
from kernel_builder.hw.facts import NPU2
from kernel_builder.instr_counts import add_acc, conv, load, store
from kernel_builder.kv_quant.reference import dequantize
from kernel_builder.numerics import to_bf16
from kernel_builder.planner import check_positive

KVD_HEAD_DIM_MULTIPLE = NPU2.vector_lanes_bf16


def kv_dequant_kernel(rows: int, heads: int, head_dim: int) -> ExternalKernel:
    """`(codes i8[rows*2*W], scales i8[rows*8*heads], k bf16[rows*W], v bf16[rows*W])`, W = heads*head_dim."""
    check_positive("kv_dequant", rows=rows, heads=heads, head_dim=head_dim)
    check_multiple("kv_dequant", "head_dim", head_dim, KVD_HEAD_DIM_MULTIPLE)
    tag = f"r{rows}_h{heads}_d{head_dim}"
    symbol = f"kvd_bf16_{tag}"
    return ExternalKernel(symbol=symbol, obj=f"kvd_{tag}.o", source="kv_dequant.cc",
                          defines=(("KVD_ROWS", str(rows)), ("KVD_HEADS", str(heads)),
                                   ("KVD_HEAD_DIM", str(head_dim)), ("KVD_SYMBOL", symbol)))


def kv_dequant_model(rows: int, heads: int, hd: int):
    w = heads * hd

    def kvd(codes, scales, k, v):
        c = need_memref(codes, "codes", rows * 2 * w, "i8").reshape(rows, 2, w)
        s = np.ascontiguousarray(need_memref(scales, "scales", rows * 8 * heads, "i8")).view(np.float32)
        s = s.reshape(rows, 2, heads)
        for t, out in enumerate((k, v)):
            need_memref(out, "kv"[t], rows * w)[:] = to_bf16(dequantize(c[:, t], s[:, t], heads, hd)).reshape(-1)
            out.written = True
    return kvd


def _kv_dequant(m, args):
    """kv_dequant.cc's vector path: per 32 codes a 32-byte load, to_float (2 conv + 2 accumulator adds), a 64-byte
    store."""
    rows, heads, hd = int(m.group(1)), int(m.group(2)), int(m.group(3))
    per32 = load(32, 1) + conv(2) + add_acc(2) + store(32, 2)
    return CallWork(0, 2 * rows * heads, per32 * (2 * rows * heads * hd // 32))


FAMILY = ExternalFamily("kv_dequant", "kv_dequant.cc", r"kvd_r(\d+)_h(\d+)_d(\d+)\.o", r"kvd_bf16_r(\d+)_h(\d+)_d(\d+)",
                        kv_dequant_kernel, kv_dequant_model)
COSTS = (ExternalCost("kv_dequant", re.compile(FAMILY.symbol_re), _kv_dequant, DEFAULT_STACK, (2, 3), (2, 3)),)
