"""The `rmsnorm` kernel's external C++ kernel (external_kernels/rmsnorm.cc): its shapes and symbols
(ExternalKernel), its numpy model for the interpreter (the .cc's portable path) and its cost/resource
descriptor for the hardware model; FAMILY and COSTS register them with the kernel spec."""
from __future__ import annotations

import re

import numpy as np

from external_kernels.compile_rules import ExternalKernel
from kernel_builder.external_costs import SOFT_FLOAT_DIV_STACK, CallWork, ExternalCost
from kernel_builder.instr_counts import Counts, add_acc, conv, load, scalar_bf16, store, vmac
from kernel_builder.external_models import F32, need_memref, seq_sum
from kernel_builder.externals import ExternalFamily, check_multiple
from kernel_builder.hw.facts import NPU2
from kernel_builder.numerics import to_bf16
from kernel_builder.planner import check_positive

RMSNORM_GROUP_MULTIPLE = NPU2.vector_lanes_bf16   # the AIE2P 32-lane bf16 vector path


def rmsnorm_kernel(group: int, units: int, offset: int | None = 0) -> ExternalKernel:
    """RMSNorm of `units` consecutive groups of `group` elements with one weight: `(x[units*group],
    w[group], y[units*group], f32 eps)`; the mean multiplies by 1/group (no run-time division). `offset` 1:
    the weight is (1 + w), added in f32 (Gemma; tag `_o1`)."""
    check_positive("rmsnorm", group=group, units=units)
    check_multiple("rmsnorm", "group", group, RMSNORM_GROUP_MULTIPLE)
    offset = offset or 0
    if offset not in (0, 1):
        raise ValueError(f"rmsnorm: offset must be 0 or 1, got {offset!r}")
    tag = f"g{group}_u{units}" + (f"_o{offset}" if offset else "")
    symbol = f"rmsnorm_bf16_{tag}"
    return ExternalKernel(
        symbol=symbol,
        obj=f"rmsnorm_{tag}.o",
        source="rmsnorm.cc",
        defines=(("RMSNORM_GROUP", str(group)), ("RMSNORM_UNITS", str(units)), ("RMSNORM_SYMBOL", symbol),
                 *((("RMSNORM_OFFSET", str(offset)),) if offset else ())),
    )


def rmsnorm_model(g: int, units: int, offset: int | None = 0):
    inv_g = F32(1.0) / F32(g)
    off = F32(offset or 0)

    def rms(x, w, y, eps):
        xf = need_memref(x, "x", units * g).reshape(units, g).astype(F32)
        wf = need_memref(w, "w", g).astype(F32) + off
        ss = seq_sum(xf * xf, np.zeros(units, dtype=F32))
        ms = (ss * inv_g).astype(F32) + F32(eps)
        r = F32(1.0) / np.sqrt(ms, dtype=F32)
        need_memref(y, "y", units * g)[:] = to_bf16((xf * r[:, None]) * wf).reshape(-1)
        y.written = True
    return rms


def _rmsnorm(m, args):
    g, u = int(m.group(1)), int(m.group(2))
    s = g // 32
    # per unit (rmsnorm.cc): s x (load, mac) sum of squares; reduce_add, invsqrt, r as a bf16 pair; then
    # s x (x and w loaded, mul + mac, to bf16, sub, to bf16, mul + mac, to bf16, store)
    unit = (s * (load(32, 2) + vmac(32)) + conv() + Counts(reduce_add=1, invsqrt_scalar=1) + scalar_bf16(2)
            + s * (load(32, 2) * 2 + vmac(32) * 4 + conv(4) + add_acc() + store(32, 2)))
    if m.group(3):   # offset (rmsnorm.cc RMSNORM_OFFSET): per step 1 + w (widened add), its bf16 pair, one more
        # mac; once: the bf16 1.0 and its accumulator
        unit = unit + s * (add_acc() * 2 + conv(4) + vmac(32))
        return CallWork(6 * g * u, 4 * u, unit * u + Counts(broadcast=1) + conv(1) + scalar_bf16(1))
    return CallWork(5 * g * u, 4 * u, unit * u)


FAMILY = ExternalFamily("rmsnorm", "rmsnorm.cc", r"rmsnorm_g(\d+)_u(\d+)(?:_o(\d+))?\.o",
                        r"rmsnorm_bf16_g(\d+)_u(\d+)(?:_o(\d+))?",
                        rmsnorm_kernel, rmsnorm_model)
COSTS = (ExternalCost("rmsnorm", re.compile(FAMILY.symbol_re), _rmsnorm, SOFT_FLOAT_DIV_STACK, (2,), (2,)),)
