"""The `rope` kernel's external C++ kernel (external_kernels/rope.cc): its shapes and symbols
(ExternalKernel), its numpy model for the interpreter (the .cc's portable path) and its cost/resource
descriptor for the hardware model; FAMILY and COSTS register them with the kernel spec."""
from __future__ import annotations

import re

import numpy as np

from external_kernels.compile_rules import ExternalKernel
from kernel_builder.external_costs import DEFAULT_STACK, CallWork, ExternalCost
from kernel_builder.instr_counts import conv, load, store, vmac
from kernel_builder.external_models import F32, need_memref
from kernel_builder.externals import ExternalFamily, check_multiple
from kernel_builder.hw.facts import NPU2
from kernel_builder.numerics import to_bf16
from kernel_builder.planner import check_positive

ROPE_HEAD_DIM_MULTIPLE = NPU2.vector_lanes_bf16   # the AIE2P 32-lane bf16 vector path


def rope_kernel(head_dim: int, heads: int, rows: int = 1) -> ExternalKernel:
    """Half-split RoPE of `rows` position rows x `heads` heads: `(x[rows][heads*head_dim],
    lut[rows][head_dim] = [cos | sin], y like x)`. The L1 types depend on all three, so the symbol does."""
    check_positive("rope", head_dim=head_dim, heads=heads, rows=rows)
    check_multiple("rope", "head_dim", head_dim, ROPE_HEAD_DIM_MULTIPLE)
    tag = f"hd{head_dim}_h{heads}_r{rows}"
    symbol = f"rope_bf16_{tag}"
    return ExternalKernel(
        symbol=symbol,
        obj=f"rope_{tag}.o",
        source="rope.cc",
        defines=(("ROPE_HEAD_DIM", str(head_dim)), ("ROPE_HEADS", str(heads)), ("ROPE_ROWS", str(rows)),
                 ("ROPE_SYMBOL", symbol)),
    )


def rope_model(hd: int, heads: int, rows: int):
    half = hd // 2

    def rope(x, lut, y):
        xf = need_memref(x, "x", rows * heads * hd).astype(F32).reshape(rows, heads, hd)
        lf = need_memref(lut, "lut", rows * hd).astype(F32).reshape(rows, 1, hd)
        c, s = lf[..., :half], lf[..., half:]
        x1, x2 = xf[..., :half], xf[..., half:]
        out = np.empty((rows, heads, hd), dtype=F32)
        out[..., :half] = x1 * c - x2 * s  # products exact in f32; one f32 add then one RNE
        out[..., half:] = x2 * c + x1 * s
        need_memref(y, "y", rows * heads * hd)[:] = to_bf16(out).reshape(-1)
        y.written = True
    return rope


def _rope(m, args):
    hd = int(m.group(1))
    e = hd * int(m.group(2)) * int(m.group(3))
    lanes = 32 if (hd // 2) % 32 == 0 else 16
    # per `lanes` of each half (rope.cc): x1, x2, cos, sin loaded; mul, msc, mul, mac; two stores
    step = load(lanes, 2) * 4 + vmac(lanes) * 4 + conv(2) + store(lanes, 2) * 2
    return CallWork(2 * e, 0, step * (e // 2 // lanes))


FAMILY = ExternalFamily("rope", "rope.cc", r"rope_hd(\d+)_h(\d+)_r(\d+)\.o", r"rope_bf16_hd(\d+)_h(\d+)_r(\d+)",
                        rope_kernel, rope_model)
COSTS = (ExternalCost("rope", re.compile(FAMILY.symbol_re), _rope, DEFAULT_STACK, (2,), (2,)),)
