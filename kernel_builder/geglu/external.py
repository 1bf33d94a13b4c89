"""The `geglu` kernel's external C++ kernel (external_kernels/geglu.cc): its shapes and symbols
(ExternalKernel), its numpy model for the interpreter (the .cc's portable path) and its cost/resource
descriptor for the hardware model; FAMILY and COSTS register them with the kernel spec."""
from __future__ import annotations

import re

import numpy as np

from external_kernels.compile_rules import ExternalKernel
from kernel_builder.external_costs import DEFAULT_STACK, CallWork, ExternalCost
from kernel_builder.instr_counts import Counts, add_acc, conv, exp2, inv, load, scalar_bf16, store, vmac
from kernel_builder.external_models import F32, need_memref
from kernel_builder.externals import elementwise_family, elementwise_kernel
from kernel_builder.hw.facts import NPU2
from kernel_builder.numerics import to_bf16

GEGLU_N_MULTIPLE = NPU2.vector_lanes_bf16   # the AIE2P 32-lane bf16 vector path


def geglu_kernel(n: int) -> ExternalKernel:
    """y[n] = gelu_tanh(gate[n]) * up[n] in f32, bf16 RNE output."""
    return elementwise_kernel("geglu", n, GEGLU_N_MULTIPLE)


def geglu_model(n: int):
    """The .cc's portable path: g / (1 + exp(-2c (g + a g^3))) * up in f32 (the reference's gelu_tanh)."""
    from kernel_builder.geglu.reference import gelu_tanh

    def geglu(gate, up, y):
        g = need_memref(gate, "gate", n).astype(F32)
        u = need_memref(up, "up", n).astype(F32)
        with np.errstate(over="ignore"):
            need_memref(y, "y", n)[:] = to_bf16(gelu_tanh(g) * u)
        y.written = True
    return geglu


def _geglu(m, args):
    n = int(m.group(1))
    # per 32 lanes (geglu.cc): gate, up loaded; g^2 and its bf16 pair, the inner factor (3 macs) and its pair,
    # the exp2 argument (mul + mac), exp2, 1 + e, inv, g * sigmoid, * up, store; once: the q pair and the bf16 1.0
    # (4 scalar conversions), the p and `one` accumulators (2 broadcasts, widened)
    step = load(32, 2) * 2 + vmac(32) * 8 + exp2(32) + inv(32) + add_acc() * 3 + conv(11) + store(32, 2)
    return CallWork(8 * n, 0, step * (n // 32) + scalar_bf16(4) + Counts(broadcast=2) + conv(2))


FAMILY = elementwise_family("geglu", geglu_kernel, geglu_model)
COSTS = (ExternalCost("geglu", re.compile(FAMILY.symbol_re), _geglu, DEFAULT_STACK, (2,), (2,)),)
