"""Cost and resource descriptor of the external C++ kernel families (external_kernels/*.cc), one row per
symbol pattern in each kernel's external.py (its SPEC's `costs`) - what the hardware model (kernel_builder.hw)
needs to know of a `func.call @sym(...)` it cannot look into: the work per call and how it runs (vector lanes or
scalar ops), the stack its call chain needs, and which memref operands it writes.

The work per call is the instruction counts of each .cc file's AIE2P (`__AIENGINE__`) path, by the host aie_api's
kinds: each descriptor writes them as formulas in the kernel's loop bounds with kernel_builder.instr_counts'
helpers (add.cc, swiglu.cc, rmsnorm.cc, rope.cc, gemv.cc in their external.py; gemm.cc's mac in
`gemm_mac_counts`; attention.cc in kernel_builder/attention/counts.py), and tests/test_kernel_counts.py checks
them equal to the host aie_api's counts call by call at every builder shape. The cost model turns them into
cycles (kernel_builder.hw.cost.compute_cycles; docs/hardware-model.md, "Counted compute"). Besides the counts:
the MAC-equivalent work (the analyzer's scalar share), the scalar float ops the host does not count (gemv's
partial-sum carry, rmsnorm's mean and eps: soft-float on AIE2P), the stack (rmsnorm's soft-float division),
the written operands, and which integer operands the work depends on (`valued`: the attention prefill item,
whose primitive skips the K/V tiles and row blocks past the causal bound). Which mmul path a kernel runs
(block-float or aie_api's emulation) is read from its compile defines (`bfp16_mmul`).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Callable

from kernel_builder.hw.facts import NPU2

DEFAULT_STACK = NPU2.default_stack_bytes
SOFT_FLOAT_DIV_STACK = NPU2.soft_float_div_stack_bytes


@dataclass(frozen=True)
class CallWork:
    vector_macs: int       # MAC-equivalent work done by vector instructions (the analyzer's scalar share)
    scalar_ops: int        # scalar float ops (soft-float / emulated) per call: C++ float arithmetic the host
                           # aie_api does not count (charged at the cost model's scalar_cycles_per_op)
    counts: dict = field(default_factory=dict)   # instruction counts per call by kind
                                                 # (kernel_builder.instr_counts: the host aie_api's kinds)

    @property
    def mmul_macs(self) -> int:
        """MACs on the matrix unit in block-float mode (8x8x8 = 512 each)."""
        return 512 * self.counts.get("mmul_bfp16_8x8x8", 0)

    @property
    def emulated_mmul_macs(self) -> int:
        """MACs of a bf16 aie::mmul compiled without the block-float flag (4x8x8 = 256 each, emulated)."""
        return 256 * self.counts.get("mmul_bf16_4x8x8_emulated", 0)


@dataclass(frozen=True)
class ExternalCost:
    family: str
    pattern: re.Pattern
    work: Callable[[re.Match, list], CallWork]   # (symbol match, call operands) -> work per call
    stack_bytes: int
    writes: tuple[int, ...]                      # memref operand positions the kernel writes
    pure_outputs: tuple[int, ...] = ()           # ... of which it never reads (first written by the call)
    valued: tuple[int, ...] = ()                 # integer operand positions the work depends on: the analyzer
                                                 # evaluates them per call (kernel_builder.hw.analyze) and
                                                 # passes ints where it can (the others stay expressions)


BFP16_FLAG = "AIE_API_EMULATE_BFLOAT16_MMUL_WITH_BFP16"


def bfp16_mmul(defines) -> bool:
    """Whether a kernel's compile defines (ExternalKernel.defines) select aie_api's block-float bf16 mmul on
    AIE2P (one matrix instruction per 8x8x8 step). Without it a bf16 aie::mmul runs aie_api's emulation
    (element-wise macs + shuffles): the cost model charges the two differently, from this declared property."""
    return any(name == BFP16_FLAG and str(value) not in ("0", "") for name, value in defines)


def external_costs() -> tuple[ExternalCost, ...]:
    """Every registered kernel's cost descriptors (kernel_builder/<kind>/external.py COSTS)."""
    from kernel_builder.registry import specs
    return tuple(c for sp in specs() for c in sp.costs)


def external_cost(symbol: str) -> tuple[ExternalCost, re.Match] | None:
    """The descriptor whose pattern matches `symbol` (whole name), with the match; None when unknown."""
    for c in external_costs():
        m = c.pattern.fullmatch(symbol)
        if m:
            return c, m
    return None


def call_counts(calls, tiles: int = 1) -> dict:
    """Instruction counts (hw/cost.py ISSUE_KINDS) of `tiles` times the (external kernel, calls) pairs: per call
    what the kernel's cost descriptor counts, its scalar ops and one "calls", as the analyzer adds them."""
    counts: dict = {}
    for kernel, n in calls:
        desc, match = external_cost(kernel.symbol)
        w = desc.work(match, [])
        for kind, v in list(w.counts.items()) + [("calls", 1), ("scalar_ops", w.scalar_ops)]:
            if v:
                counts[kind] = counts.get(kind, 0) + tiles * n * v
    return counts
