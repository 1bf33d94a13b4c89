"""The `geglu` kernel's external C++ kernel (external_kernels/geglu.cc): its shapes and symbols
(ExternalKernel), its numpy model for the interpreter (the .cc's portable path) and its cost/resource
descriptor for the hardware model; FAMILY and COSTS register them with the kernel spec."""
from __future__ import annotations

import re

import numpy as np

from external_kernels.compile_rules import ExternalKernel
from kernel_builder.external_costs import DEFAULT_STACK, CallWork, ExternalCost
from kernel_builder.external_models import F32, need_memref
from kernel_builder.externals import ExternalFamily, check_multiple
from kernel_builder.hw.facts import NPU2
from kernel_builder.numerics import to_bf16
from kernel_builder.planner import check_positive

GEGLU_N_MULTIPLE = NPU2.vector_lanes_bf16   # the AIE2P 32-lane bf16 vector path


def geglu_kernel(n: int) -> ExternalKernel:
    """y[n] = gelu_tanh(gate[n]) * up[n] in f32, bf16 RNE output."""
    check_positive("geglu", n=n)
    check_multiple("geglu", "n", n, GEGLU_N_MULTIPLE)
    symbol = f"geglu_bf16_n{n}"
    return ExternalKernel(symbol=symbol, obj=f"geglu_n{n}.o", source="geglu.cc",
                          defines=(("GEGLU_N", str(n)), ("GEGLU_SYMBOL", symbol)))


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
    """Per 32 lanes: g^2 and its bf16 split, the cubic's inner factor (3 macs), its split, the exp2 argument
    (2 macs), exp2, 1 + e, inv, g * sigmoid, * up: ~12 vector ops and 9 bf16 macs per lane group."""
    n = int(m.group(1))
    return CallWork(12 * n / 32, 9 * n, 0)


FAMILY = ExternalFamily("geglu", "geglu.cc", r"geglu_n(\d+)\.o", r"geglu_bf16_n(\d+)", geglu_kernel, geglu_model)
COSTS = (ExternalCost("geglu", re.compile(FAMILY.symbol_re), _geglu, DEFAULT_STACK, (2,), (2,)),)
