"""Cost and resource descriptor of every external C++ kernel family (external_kernels/*.cc), in
ONE table keyed by symbol pattern - what the hardware model (kernel_builder.hw) needs to know of a
`func.call @sym(...)` it cannot look into: the work per call and how it runs (vector lanes or scalar ops),
the stack its call chain needs, and which memref operands it writes.

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
- attention.cc (the `attention` kernel): prefill `item` runs q.K^T and p.V on the bf16 matrix unit
  (`mmul_macs`, 4*lk*hd MACs each per computed 4-row block - the kernel skips the blocks and tiles past the
  causal bound, which the analyzer evaluates from the call's operands; the in-register K-block transposes
  issue around the mmuls as in gemm.cc),
  decode `step` on 32-/16-lane macs; both carry the online-softmax bookkeeping per score (query, key): mask,
  max, subtract, exp2 (costed per score by the cost model's `softmax_cycles_per_score`); reciprocals come from
  a bf16 `aie::inv` and an f32 Newton step (no soft-float division: the default stack holds);
- gemm.cc: zero / out stream the f32 tile once (32 lanes); mac runs tm*tk*tn MACs as 8x8x8 `aie::mmul` steps
  on the matrix unit (`mmul_macs`, costed at the bf16 mmul rate like the registry GEMM points the cost model is
  calibrated on, whose mm_aie2p.cc kernel also loads/stores its f32 accumulator blocks on every call: those
  loads/stores and the w-block `aie::transpose`s issue in the VLIW bundles around the mmuls and are not
  counted separately).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable

DEFAULT_STACK = 1024       # bytes; kernel_builder.hw.facts.NPU2.default_stack_bytes
SOFT_FLOAT_DIV_STACK = 1152  # kernel_builder.hw.facts.NPU2.soft_float_div_stack_bytes


@dataclass(frozen=True)
class CallWork:
    vector_cycles: float   # cycles on the vector unit at full issue (before the cost model's efficiency)
    vector_macs: int       # MAC-equivalent work done by vector instructions
    scalar_ops: int        # scalar float ops (soft-float / emulated) per call
    scores: int = 0        # attention scores (query, key pairs) through the online-softmax bookkeeping
    mmul_macs: int = 0     # MACs on the matrix unit (aie::mmul), costed at the bf16 mmul rate


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


def _gemv(m, args):
    kc, tm = int(m.group(2)), int(m.group(3))
    return CallWork(kc * tm / 32, kc * tm, 2 * tm)


def _rope(m, args):
    hd = int(m.group(1))
    e = hd * int(m.group(2)) * int(m.group(3))
    lanes = 32 if (hd // 2) % 32 == 0 else 16
    return CallWork(2 * e / lanes, 2 * e, 0)


def _swiglu(m, args):
    n = int(m.group(1))
    return CallWork(6 * n / 32, 4 * n, 0)


def _rmsnorm(m, args):
    g, u = int(m.group(1)), int(m.group(2))
    return CallWork(6 * g * u / 32, 5 * g * u, 4 * u)


def _add(m, args):
    n = int(m.group(1))
    return CallWork(n / 32, n, 0)


ATTN_ROW_BLOCK = 4   # query rows per bf16 mmul<4, 8, 8> block of the prefill item (attention.cc)


def attn_prefill_blocks(lq: int, lk: int, q_pos0: int, k_pos0: int) -> int:
    """Row blocks (4 query rows at q_pos0 + i) that attention.cc's prefill `item` computes against the K/V
    tile at k_pos0 (AIE2P `update_prefill`): none when every key lies after every query of the tile (the early
    return), else the blocks whose last row sees the tile's first key (the `continue` skips the others)."""
    if k_pos0 > q_pos0 + lq - 1:
        return 0
    return sum(1 for i0 in range(0, lq, ATTN_ROW_BLOCK) if k_pos0 <= q_pos0 + i0 + ATTN_ROW_BLOCK - 1)


def _attn_item_blocks(hd: int, lq: int, lk: int, blocks: int, zeroed_keys: int) -> CallWork:
    """`blocks` computed row blocks of a prefill item: per block q.K^T and p.V (4 rows x lk keys x hd, twice)
    on the matrix unit, 4 x lk scores through the softmax, the alpha rescale of 4 acc rows (8-lane f32);
    plus zeroing the V rows of the keys no row of the tile sees (32-lane stores)."""
    macs = 2 * ATTN_ROW_BLOCK * lk * hd * blocks
    return CallWork(ATTN_ROW_BLOCK * hd / 8 * blocks + zeroed_keys * hd / 32, macs, 0,
                    ATTN_ROW_BLOCK * lk * blocks, mmul_macs=macs)


def _attn(m, args):
    """attention.cc (kernels/attention.py). Prefill item: with its operands (t, n_q, q_pos0) known, a Q item
    (t < n_q) is a copy of at most one tile (32-lane loads/stores), a K/V item computes only the row blocks
    `attn_prefill_blocks` names (the kernel skips the others, causal); with an operand unknown, a full tile
    (every row block). Per row block: q.K^T and p.V on the bf16 matrix unit (mmul<4, 8, 8>, `mmul_macs`; the
    in-register K transposes issue around the mmuls, as gemm.cc's w transposes) plus the alpha rescale of acc
    (8-lane f32). Decode step: 32-lane q.k macs + reduction per key, 16-lane p.V macs. Both: the softmax
    bookkeeping per score (the cost model's softmax_cycles_per_score), the per-row statistics in vector lanes
    (no scalar float ops)."""
    mode, part, hd, lq, lk = m.group(1), m.group(2), int(m.group(3)), int(m.group(4)), int(m.group(5))
    n = int(m.group(6) or 1)
    qk = pv = lq * lk * hd
    if part == "init":
        return CallWork(lq * hd / 16 + (lq * hd / 32 if mode == "p" else 0), 0, 0)
    if part == "item":
        t, n_q, q_pos0 = (args[i] if len(args) > i else None for i in (3, 4, 6))
        if all(isinstance(x, int) for x in (t, n_q, q_pos0)):
            if t < n_q:
                return CallWork(lq * hd / 32, 0, 0)
            k_pos0 = (t - n_q) * lk
            blocks = attn_prefill_blocks(lq, lk, q_pos0, k_pos0)
            seen = min(max(q_pos0 + lq - k_pos0, 0), lk)     # keys some row of the tile sees
            return _attn_item_blocks(hd, lq, lk, blocks, lk - seen if blocks else 0)
        return _attn_item_blocks(hd, lq, lk, -(-lq // ATTN_ROW_BLOCK), 0)
    if part == "step":
        return CallWork(qk / 32 + 5 * lq * lk + pv / 16 + lq * hd / 16, qk + pv, 0, lq * lk)
    if part == "finish":   # out = acc * (1/l) and the state emptied for the next query block
        return CallWork(2 * lq * hd / 16 + lq / 4, lq * hd, 0)
    return CallWork(lq * (n * hd / 16 + hd / 16) + 8 * n, n * lq * hd, 0)   # merge


def _gemm(m, args):
    part, tm, tk, tn = m.group(1), int(m.group(2)), int(m.group(3)), int(m.group(4))
    if part != "mac":  # zero / out: one pass over the f32 tile
        return CallWork(tm * tn / 32, 0, 0)
    macs = tm * tk * tn
    return CallWork(0.0, macs, 0, mmul_macs=macs)


EXTERNAL_COSTS: tuple[ExternalCost, ...] = (
    # gemv(w, x, acc, y, row, k0): writes acc (partial sums, read back by later K chunks) and y
    ExternalCost("gemv", re.compile(r"mv_bf16_k(\d+)_c(\d+)_m(\d+)_r(\d+)"), _gemv, DEFAULT_STACK, (2, 3), (3,)),
    ExternalCost("rope", re.compile(r"rope_bf16_hd(\d+)_h(\d+)_r(\d+)"), _rope, DEFAULT_STACK, (2,), (2,)),
    ExternalCost("swiglu", re.compile(r"swiglu_bf16_n(\d+)"), _swiglu, DEFAULT_STACK, (2,), (2,)),
    ExternalCost("rmsnorm", re.compile(r"rmsnorm_bf16_g(\d+)_u(\d+)"), _rmsnorm, SOFT_FLOAT_DIV_STACK, (2,), (2,)),
    ExternalCost("add", re.compile(r"add_bf16_n(\d+)"), _add, DEFAULT_STACK, (2,), (2,)),
    ExternalCost("attn_init", re.compile(r"attn(p)_(init)_bf16_hd(\d+)_q(\d+)_k(\d+)()"), _attn, DEFAULT_STACK,
                 (0, 1), (0, 1)),
    ExternalCost("attn_init", re.compile(r"attn(d)_(init)_bf16_hd(\d+)_q(\d+)_k(\d+)_n(\d+)"), _attn,
                 DEFAULT_STACK, (0,), (0,)),
    ExternalCost("attn_item", re.compile(r"attn(p)_(item)_bf16_hd(\d+)_q(\d+)_k(\d+)()"), _attn, DEFAULT_STACK,
                 (1, 2), valued=(3, 4, 6)),
    ExternalCost("attn_finish", re.compile(r"attn(p)_(finish)_bf16_hd(\d+)_q(\d+)_k(\d+)()"), _attn, DEFAULT_STACK,
                 (1,), (1,)),
    ExternalCost("attn_step", re.compile(r"attn(d)_(step)_bf16_hd(\d+)_q(\d+)_k(\d+)_n(\d+)"), _attn,
                 DEFAULT_STACK, (1,)),
    ExternalCost("attn_merge", re.compile(r"attn(d)_(merge)_bf16_hd(\d+)_q(\d+)_k(\d+)_n(\d+)"), _attn,
                 DEFAULT_STACK, (1,), (1,)),
    ExternalCost("gemm_zero", re.compile(r"gemm_(zero)_bf16_m(\d+)_k(\d+)_n(\d+)"), _gemm, DEFAULT_STACK, (0,), (0,)),
    ExternalCost("gemm_mac", re.compile(r"gemm_(mac)_bf16_m(\d+)_k(\d+)_n(\d+)"), _gemm, DEFAULT_STACK, (2,)),
    ExternalCost("gemm_out", re.compile(r"gemm_(out)_bf16_m(\d+)_k(\d+)_n(\d+)"), _gemm, DEFAULT_STACK, (1,), (1,)),
)


def external_cost(symbol: str) -> tuple[ExternalCost, re.Match] | None:
    """The descriptor whose pattern matches `symbol` (whole name), with the match; None when unknown."""
    for c in EXTERNAL_COSTS:
        m = c.pattern.fullmatch(symbol)
        if m:
            return c, m
    return None
