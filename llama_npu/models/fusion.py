"""GEMM epilogue fusion: a rewrite of a layer graph for the phases whose linear ops are GEMMs (more than one row).

Where a family's graph has a linear op whose only consumer is an elementwise op a GEMM epilogue performs, the two
ops become one fused op, so one launch does the work and the intermediate never travels through DDR:

- `swiglu(linear(x, w_gate_up))` (the one-input SwiGLU over the (gate, up) pairs of the projection by the gate
  and up weights interleaved by 8 rows, llama.GATE_UP) -> `linear_swiglu(x, w_gate_up)` (kernel gemm_swiglu:
  each tile computes its gate and up columns as pairs of 8-column blocks and writes silu(gate) * up). Applied by
  default: its W panel is ONE L3 DMA of contiguous rows, like the plain GEMM's, and it lowers through the real
  lowering (mlir-air efeb41ce4 + mlir-aie ae8ed9d; tests/test_air_lower_gemm.py). The two-weight form
  (swiglu(linear(x, w_gate), linear(x, w_up)), the 4-bit graphs) is not fused: its panel needed two loads, which
  air-to-aie's memory-tile placement cannot fit (kernel_builder/hw/memtile_place.py);
- `bias_add(linear(x, w), b)` -> `linear_bias(x, w, b)` (kernel gemm_bias: the bias row added to the f32
  accumulator before the one bf16 rounding; Qwen2's q/k/v projections, also when the result goes into a state).
  NOT applied by default. Its bias slice takes a DMA of its own into the W panel's memory tile (the two share a
  channel index, so air-to-aie buckets them): b + A + W + C = 7 S2MM on an 8-column herd, rejected by the
  hardware model and the lowering alike, so the planner gives it a 4-column herd (half the cores: modeled slower
  than the GEMM + bias_add at 256x1536x256, no plan at 2048x1536x1536), and its cores' W channel is not one
  uniform BD chain (the bias get before the K loop: repeat-count DMAs, which need a PDI reload between launch
  iterations). Carrying the bias on the W panel's own L3 channel (one S2MM) lowered at 64 rows but exhausted the
  shim BDs at 2048 rows (docs/kernels.md "Epilogues"). Qwen2's prefill keeps its bias_add launches.

The fused op takes the consumer's place and output name (and `into`), so the phase's segment cuts and every
other op are unchanged. Nothing here names a model: the families' graphs decide what is fused.
"""
from __future__ import annotations

from dataclasses import replace

from .graph import LayerGraph, Op


DEFAULT: tuple[str, ...] = ("swiglu",)   # the consumer kinds fused by default (of "swiglu", "bias_add")


def fuse_epilogues(graph: LayerGraph, kinds: tuple[str, ...] = DEFAULT) -> LayerGraph:
    """The graph with every fusible (linear -> `kinds` op) chain replaced by its fused op (bf16 weights only: a
    q4 GEMM reads its weight through a dequant_q4 scratch, which the fused rules do not wire; block-float weights
    fuse the SwiGLU: gemm_bfp's swiglu epilogue)."""
    if graph.weights not in ("bf16", "bfp16"):
        return graph
    ops = list(graph.ops)
    by_out = {op.out: op for op in ops if not op.into}
    readers: dict[str, int] = {}
    for op in ops:
        for t in op.ins:
            readers[t] = readers.get(t, 0) + 1

    def private_linear(t: str, op: Op) -> Op | None:
        """The linear op producing `t` when `op` is its only reader and nobody else needs it."""
        src = by_out.get(t)
        if src is None or src.kind != "linear" or readers.get(t) != 1 or t in graph.outputs:
            return None
        return src

    dropped: set[str] = set()
    out: list[Op] = []
    for op in ops:
        fused = None
        if op.kind not in kinds:
            pass
        elif op.kind == "swiglu" and len(op.ins) == 1:   # the interleaved pairs of one projection
            lin = private_linear(op.ins[0], op)
            if lin and lin.width == 2 * op.width:
                fused = Op("linear_swiglu", lin.ins, op.out, op.width, {}, op.into)
                dropped.add(lin.out)
        elif op.kind == "bias_add":
            lin = private_linear(op.ins[0], op)
            if lin and lin.width == op.width:
                fused = Op("linear_bias", (lin.ins[0], lin.ins[1], op.ins[1]), op.out, op.width, op.params, op.into)
                dropped.add(lin.out)
        out.append(fused or op)
    return replace(graph, ops=[op for op in out if op.out not in dropped])
