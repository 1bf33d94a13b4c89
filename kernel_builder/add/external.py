"""The `add` kernel's external C++ kernel (external_kernels/add.cc): its shapes and symbols
(ExternalKernel), its numpy model for the interpreter (the .cc's portable path) and its cost/resource
descriptor for the hardware model; FAMILY and COSTS register them with the kernel spec."""
from __future__ import annotations

import re

from external_kernels.compile_rules import ExternalKernel
from kernel_builder.external_costs import DEFAULT_STACK, CallWork, ExternalCost
from kernel_builder.instr_counts import add_acc, conv, load, store
from kernel_builder.external_models import F32, need_memref
from kernel_builder.externals import elementwise_family, elementwise_kernel
from kernel_builder.hw.facts import NPU2
from kernel_builder.numerics import to_bf16

ADD_N_MULTIPLE = NPU2.vector_lanes_bf16   # the AIE2P 32-lane bf16 vector path


def add_kernel(n: int) -> ExternalKernel:
    """y[n] = a[n] + b[n] (f32 add, bf16 RNE)."""
    return elementwise_kernel("add", n, ADD_N_MULTIPLE)


def add_model(n: int):
    def add(a, b, y):
        s = need_memref(a, "a", n).astype(F32) + need_memref(b, "b", n).astype(F32)
        need_memref(y, "y", n)[:] = to_bf16(s)
        y.written = True
    return add


def _add(m, args):
    n = int(m.group(1))
    # per 32 lanes (add.cc): a and b loaded, accum from a, add (b widened), to bf16, store
    step = load(32, 2) * 2 + conv(3) + add_acc() + store(32, 2)
    return CallWork(n, 0, step * (n // 32))


FAMILY = elementwise_family("add", add_kernel, add_model)
COSTS = (ExternalCost("add", re.compile(FAMILY.symbol_re), _add, DEFAULT_STACK, (2,), (2,)),)
