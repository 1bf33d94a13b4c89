"""Cost and resource descriptor of the external C++ kernel families (external_kernels/*.cc), one row per
symbol pattern in each kernel's external.py (its SPEC's `costs`) - what the hardware model (kernel_builder.hw)
needs to know of a `func.call @sym(...)` it cannot look into: the work per call and how it runs (vector lanes or
scalar ops), the stack its call chain needs, and which memref operands it writes.

The figures follow the AIE2P (`__AIENGINE__`) path of each .cc file:
- gemv.cc: one 32-lane bf16 `aie::mac` per 32 elements of each row of the K chunk (KC*M MACs per call), two f32
  scalar ops per row (partial-sum carry, reduce);
- rope.cc: per head, mul + msc / mul + mac on both halves, 32 lanes when head_dim/2 allows, else 16
  (2 MACs per element);
- swiglu.cc: 32-lane mul, tanh (two 16-lane ops), mac, mul, mul per 32 elements (6 vector ops);
- rmsnorm.cc: 32-lane mac per 32 elements (sum of squares), then mul, mac, sub, mul, mac per 32 elements
  (x*r and (x*r)*w from bf16 hi/lo pairs); per group a few f32 scalar ops and `aie::invsqrt` on the scalar
  unit, which has no FPU on AIE2P (soft-float; stack as for a division);
- add.cc: one 32-lane accfloat add per 32 elements;
- attention.cc (the `attention` kernel): prefill `item` runs q.K^T and p.V as bf16 aie::mmul<4, 8, 8>
  (4*lk*hd MACs each per computed 4-row block; `mmul_macs` when the kernel's compile defines carry aie_api's
  block-float flag, else `emulated_mmul_macs`: aie_api then emulates the mmul with element-wise macs and
  shuffles, charged at the cost model's emulated rate - `bfp16_mmul`; the kernel skips the blocks and tiles past the
  causal bound, which the analyzer evaluates from the call's operands; the in-register K-block transposes
  issue around the mmuls as in gemm.cc),
  decode `step` on 32-/16-lane macs; both carry the online-softmax bookkeeping per score (query, key): mask,
  max, subtract, exp2 (costed per score by the cost model's `softmax_cycles_per_score`); reciprocals come from
  a bf16 `aie::inv` and an f32 Newton step (no soft-float division: the default stack holds);
- gemm.cc: zero / out stream the f32 tile once (32 lanes); mac runs tm*tk*tn MACs as 8x8x8 `aie::mmul` steps
  on the matrix unit, compiled with the block-float flag (`mmul_macs`, costed at the bf16 mmul rate x the
  registry's measured GEMM efficiency, whose mm_aie2p.cc kernel also loads/stores its f32 accumulator blocks on
  every call: those
  loads/stores and the w-block `aie::transpose`s issue in the VLIW bundles around the mmuls and are not
  counted separately).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable

from kernel_builder.hw.facts import NPU2

DEFAULT_STACK = NPU2.default_stack_bytes
SOFT_FLOAT_DIV_STACK = NPU2.soft_float_div_stack_bytes


@dataclass(frozen=True)
class CallWork:
    vector_cycles: float   # cycles on the vector unit at full issue (before the cost model's efficiency)
    vector_macs: int       # MAC-equivalent work done by vector instructions
    scalar_ops: int        # scalar float ops (soft-float / emulated) per call
    scores: int = 0        # attention scores (query, key pairs) through the online-softmax bookkeeping
    mmul_macs: int = 0     # MACs on the matrix unit (aie::mmul) in aie_api's block-float mode, costed at the
                           # bf16 mmul rate x gemm_efficiency
    emulated_mmul_macs: int = 0  # MACs of a bf16 aie::mmul compiled WITHOUT the block-float flag: aie_api builds it
                                 # from element-wise vector macs and shuffles (costed at mmul_emulated_macs_per_cycle)


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


def mmul_split(macs: int, defines) -> dict:
    """CallWork's matrix-unit field for `macs` MACs of a kernel compiled with `defines`."""
    return {"mmul_macs": macs} if bfp16_mmul(defines) else {"emulated_mmul_macs": macs}


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
