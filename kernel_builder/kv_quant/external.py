"""The `kv_quant` kernel's external C++ kernel (external_kernels/kv_quant.cc): shapes and symbols, the numpy model
of its portable path for the interpreter, and its counted cost; FAMILY and COSTS register them with the spec."""
from __future__ import annotations

import re

import numpy as np

from external_kernels.compile_rules import ExternalKernel
from kernel_builder.external_costs import DEFAULT_STACK, CallWork, ExternalCost
from kernel_builder.external_models import need_memref
from kernel_builder.externals import ExternalFamily, check_multiple
from kernel_builder.hw.facts import NPU2
from kernel_builder.instr_counts import Counts, add_acc, conv, fmul, load, store
from kernel_builder.kv_quant.reference import SCALE_BYTES, quantize
from kernel_builder.planner import check_positive

KVQ_HEAD_DIM_MULTIPLE = NPU2.vector_lanes_bf16   # one 32-lane to_fixed per step
LANES = NPU2.vector_lanes_f32


def rows_heads_kernel(kind: str, prefix: str, rows: int, heads: int, head_dim: int, multiple: int) -> ExternalKernel:
    """The frame of the KV8 row kernels (kv_quant.cc, kv_dequant.cc): `rows` rows of `heads` heads, symbol
    `<prefix>_bf16_r<R>_h<H>_d<D>` in `<prefix>_r<R>_h<H>_d<D>.o`, shape and symbol from -D <PREFIX>_ROWS,
    _HEADS, _HEAD_DIM and _SYMBOL; head_dim a multiple of `multiple`."""
    check_positive(kind, rows=rows, heads=heads, head_dim=head_dim)
    check_multiple(kind, "head_dim", head_dim, multiple)
    tag = f"r{rows}_h{heads}_d{head_dim}"
    symbol, up = f"{prefix}_bf16_{tag}", prefix.upper()
    return ExternalKernel(symbol=symbol, obj=f"{prefix}_{tag}.o", source=f"{kind}.cc",
                          defines=((f"{up}_ROWS", str(rows)), (f"{up}_HEADS", str(heads)),
                                   (f"{up}_HEAD_DIM", str(head_dim)), (f"{up}_SYMBOL", symbol)))


def rows_heads_family(kind: str, prefix: str, kernel, model) -> ExternalFamily:
    """The ExternalFamily of a KV8 row kernel named as `rows_heads_kernel` names it."""
    return ExternalFamily(kind, f"{kind}.cc", rf"{prefix}_r(\d+)_h(\d+)_d(\d+)\.o",
                          rf"{prefix}_bf16_r(\d+)_h(\d+)_d(\d+)", kernel, model)


def kv_quant_kernel(rows: int, heads: int, head_dim: int) -> ExternalKernel:
    """`(x bf16[rows*heads*hd], codes i8[rows*heads*hd], scales i8[rows*heads*4])`: rows quantized per head."""
    return rows_heads_kernel("kv_quant", "kvq", rows, heads, head_dim, KVQ_HEAD_DIM_MULTIPLE)


def kv_quant_model(rows: int, heads: int, hd: int):
    def kvq(x, codes, scales):
        xf = need_memref(x, "x", rows * heads * hd).astype(np.float32)
        c, s = quantize(xf.reshape(rows, heads * hd), heads, hd)
        need_memref(codes, "codes", rows * heads * hd, "i8")[:] = c.reshape(-1)
        need_memref(scales, "scales", rows * heads * SCALE_BYTES, "i8")[:] = s.reshape(-1).view(np.int8)
        codes.written = scales.written = True
    return kvq


def head_counts(hd: int) -> Counts:
    """kv_quant.cc's vector path for one (row, head): per 16 lanes the bf16 load, widening (conv 2), the f32
    negation (an emulated f32 multiply + conv) and two maxes; the reduce; per 32 lanes the load, to_fixed
    (2 conv + 2 accumulator adds) and the 32-byte code store."""
    per16 = load(LANES, 2) + conv(2) + fmul(LANES) + conv() + Counts(vmax=2)
    per32 = load(32, 2) + conv(2) + add_acc(2) + store(32, 1)
    return Counts(broadcast=0) + (hd // LANES) * per16 + Counts(reduce_max=1) + (hd // 32) * per32


def _kv_quant(m, args):
    rows, heads, hd = int(m.group(1)), int(m.group(2)), int(m.group(3))
    return CallWork(0, 4 * rows * heads, head_counts(hd) * (rows * heads))


FAMILY = rows_heads_family("kv_quant", "kvq", kv_quant_kernel, kv_quant_model)
COSTS = (ExternalCost("kv_quant", re.compile(FAMILY.symbol_re), _kv_quant, DEFAULT_STACK, (1, 2), ()),)
