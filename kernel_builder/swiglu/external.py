"""The `swiglu` kernel's external C++ kernel (external_kernels/swiglu.cc): its shapes and symbols
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

SWIGLU_N_MULTIPLE = NPU2.vector_lanes_bf16   # the AIE2P 32-lane bf16 vector path


def swiglu_kernel(n: int) -> ExternalKernel:
    """y[n] = silu(gate[n]) * up[n] in f32, bf16 RNE output."""
    return elementwise_kernel("swiglu", n, SWIGLU_N_MULTIPLE)


def swiglu_model(n: int):
    def swiglu(gate, up, y):
        g = need_memref(gate, "gate", n).astype(F32)
        u = need_memref(up, "up", n).astype(F32)
        with np.errstate(over="ignore"):
            silu = g / (F32(1.0) + np.exp(-g))
        need_memref(y, "y", n)[:] = to_bf16(silu * u)
        y.written = True
    return swiglu


def _swiglu(m, args):
    n = int(m.group(1))
    # per 32 lanes (swiglu.cc): gate, up loaded; mul + mac (-g log2e), exp2, 1 + e, inv, mul, mul, store;
    # once: the log2e pair and the bf16 1.0 (3 scalar conversions), the `one` accumulator (broadcast + widen)
    step = load(32, 2) * 2 + vmac(32) * 4 + exp2(32) + inv(32) + add_acc() + conv(5) + store(32, 2)
    return CallWork(4 * n, 0, step * (n // 32) + scalar_bf16(3) + Counts(broadcast=1) + conv(1))


FAMILY = elementwise_family("swiglu", swiglu_kernel, swiglu_model)
COSTS = (ExternalCost("swiglu", re.compile(FAMILY.symbol_re), _swiglu, DEFAULT_STACK, (2,), (2,)),)
