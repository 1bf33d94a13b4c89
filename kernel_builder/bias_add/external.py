"""The `bias_add` kernel's external C++ kernel: external_kernels/add.cc compiled under its own symbol and object
(`bias_add_bf16_n<dim>`, `bias_add_n<dim>.o`): one call adds the bias row to one row of x (y = x + b, f32 add,
bf16 RNE). Its numpy model and cost are add's; FAMILY and COSTS register them with the kernel spec."""
from __future__ import annotations

import re

from external_kernels.compile_rules import ExternalKernel
from kernel_builder.add.external import ADD_N_MULTIPLE, add_model
from kernel_builder.external_costs import DEFAULT_STACK, CallWork, ExternalCost
from kernel_builder.externals import ExternalFamily, check_multiple
from kernel_builder.instr_counts import add_acc, conv, load, store
from kernel_builder.planner import check_positive


def bias_add_kernel(n: int) -> ExternalKernel:
    """y[n] = x[n] + b[n] for one row of n elements (the add.cc source)."""
    check_positive("bias_add", n=n)
    check_multiple("bias_add", "n", n, ADD_N_MULTIPLE)
    symbol = f"bias_add_bf16_n{n}"
    return ExternalKernel(symbol=symbol, obj=f"bias_add_n{n}.o", source="add.cc",
                          defines=(("ADD_N", str(n)), ("ADD_SYMBOL", symbol)))


def _bias_add(m, args):
    n = int(m.group(1))
    # per 32 lanes (add.cc): x and b loaded, accum from x, add (b widened), to bf16, store
    step = load(32, 2) * 2 + conv(3) + add_acc() + store(32, 2)
    return CallWork(n, 0, step * (n // 32))


FAMILY = ExternalFamily("bias_add", "add.cc", r"bias_add_n(\d+)\.o", r"bias_add_bf16_n(\d+)", bias_add_kernel,
                        add_model)
COSTS = (ExternalCost("bias_add", re.compile(FAMILY.symbol_re), _bias_add, DEFAULT_STACK, (2,), (2,)),)
