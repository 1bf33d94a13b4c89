"""The `kv_dequant` kernel's external C++ kernel (external_kernels/kv_dequant.cc): shapes and symbols, the numpy
model of its portable path, and its counted cost; FAMILY and COSTS register them with the kernel spec."""
from __future__ import annotations

import re

from external_kernels.compile_rules import ExternalKernel
from kernel_builder.external_costs import DEFAULT_STACK, CallWork, ExternalCost
from kernel_builder.external_models import need_memref
from kernel_builder.hw.facts import NPU2
from kernel_builder.instr_counts import Counts, add_acc, conv, load, load_unaligned, store
from kernel_builder.kv_quant.external import rows_heads_family, rows_heads_kernel
from kernel_builder.kv_quant.reference import block_bytes, dequantize, row_bytes, split_rows
from kernel_builder.numerics import to_bf16

KVD_HEAD_DIM_MULTIPLE = NPU2.vector_lanes_bf16


def kv_dequant_kernel(rows: int, heads: int, head_dim: int) -> ExternalKernel:
    """`(kv i8[rows*row_bytes], k bf16[rows*W], v bf16[rows*W])`, W = heads*head_dim: whole KV8 rows in."""
    return rows_heads_kernel("kv_dequant", "kvd", rows, heads, head_dim, KVD_HEAD_DIM_MULTIPLE)


def kv_dequant_model(rows: int, heads: int, hd: int):
    w = heads * hd

    def kvd(kv, k, v):
        kc, vc, ks, vs = split_rows(need_memref(kv, "kv", rows * row_bytes(heads, hd), "i8"), heads, hd)
        for out, c, s, name in ((k, kc, ks, "k"), (v, vc, vs, "v")):
            need_memref(out, name, rows * w)[:] = to_bf16(dequantize(c, s, heads, hd)).reshape(-1)
            out.written = True
    return kvd


def _kv_dequant(m, args):
    """kv_dequant.cc's vector path: per 32 codes a 32-byte load (unaligned - two loads and a shuffle - unless the
    address is 32-byte aligned), to_float (2 conv + 2 accumulator adds), a 64-byte store."""
    rows, heads, hd = int(m.group(1)), int(m.group(2)), int(m.group(3))
    c = Counts()
    for r in range(rows):
        for t in range(2):
            for h in range(heads):
                for d in range(0, hd, 32):
                    at = r * row_bytes(heads, hd) + h * block_bytes(hd) + t * hd + d
                    c += (load(32, 1) if at % 32 == 0 else load_unaligned(32, 1)) + conv(2) + add_acc(2) + store(32, 2)
    return CallWork(0, 2 * rows * heads, c)


FAMILY = rows_heads_family("kv_dequant", "kvd", kv_dequant_kernel, kv_dequant_model)
COSTS = (ExternalCost("kv_dequant", re.compile(FAMILY.symbol_re), _kv_dequant, DEFAULT_STACK, (2, 3), (2, 3)),)
