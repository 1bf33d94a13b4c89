"""`--kv int8`: a layer's KV cache as ONE state of int8 rows (KV8; kernel_builder/kv_quant/reference.py has the row
layout: K codes, V codes, K scales, V scales per position; docs/quantization.md "KV cache").

`kv8_graph` rewrites a layer graph whose K/V projections append `into` the bf16 caches: K (after RoPE) and V become
activations (`k_new`, `v_new`) that the attention op takes with the KV8 state. `attention` is the lowering rule of
such an op: the call's K and V rows are quantized into the state's window at the call's position (two `kv_quant`
launches), then
  - decode (one row): `attention_kv8` reads the int8 window [0, kv_rows) (half the bf16 cache's bytes);
  - a prefill chunk: `kv_dequant` writes the window's bf16 K and V into two scratch states (one buffer each for
    every layer and module, like the q4 prefill's weight scratch), which the bf16 `attention` kernel reads.
The cache holds only int8: every key a query sees, its own included, went through the quantization.
"""
from __future__ import annotations

from dataclasses import replace

from multi_launch_builder.decl import Arg, Role
from kernel_builder.kv_quant.reference import row_bytes
from kernel_builder.registry import kernel

from .graph import POS, LayerGraph, Op, Phase, State

KV8_CACHE = "kv8_cache"
KV8_SCRATCH_PREFIX = "kv8_deq_"        # the prefill's dequantized K / V windows (one buffer each for all layers)
KV8_K_SCRATCH, KV8_V_SCRATCH = KV8_SCRATCH_PREFIX + "k", KV8_SCRATCH_PREFIX + "v"


def kv8_graph(graph: LayerGraph, shapes) -> LayerGraph:
    """The graph with its K/V appends turned into activations read by an int8-cache attention op."""
    caches = {op.into: op.out for op in graph.ops if op.into}
    if len(caches) != 2:
        raise ValueError(f"kv int8: the layer graph appends to {sorted(caches)}, expected a K and a V cache")
    k_state = next(op.ins[1].name for op in graph.ops if op.kind == "attention")
    v_state = next(op.ins[2].name for op in graph.ops if op.kind == "attention")
    ops = []
    for op in graph.ops:
        if op.into:
            op = replace(op, into="")
        elif op.kind == "attention":
            q, k, v = op.ins
            op = Op("attention", (q, caches[k.name], caches[v.name], State(KV8_CACHE)), op.out, op.width,
                    {**op.params, "kv": "int8"})
        ops.append(op)
    states = {n: w for n, w in graph.states.items() if n not in (k_state, v_state)}
    states[KV8_CACHE] = row_bytes(shapes.n_kv_heads, shapes.head_dim)
    return replace(graph, ops=ops, states=states)


def attention(op: Op, phase: Phase, graph: LayerGraph):
    """The lowering rule of an int8-cache attention op (module doc)."""
    q, k_new, v_new, cache = op.ins
    hd, heads, kvh = op.params["head_dim"], op.params["heads"], op.params["kv_heads"]
    rows, window = phase.rows, phase.kv_rows
    if phase.slide or op.params.get("window"):
        raise ValueError("kv int8: sliding-window attention reads the bf16 cache only")
    extra = {k: op.params[k] for k in ("scale_dim",) if op.params.get(k)}
    rb = row_bytes(kvh, hd)
    new = Arg("kv_new", (rows, rb), Role.STATE, "i8", state=cache.name, at=POS)
    ctx = Arg("kv_ctx", (window, rb), Role.STATE, "i8", state=cache.name)
    pos = Arg(POS, (1,), Role.SCALAR, "i32")
    pre = [("kq", kernel("kv_quant", rows, kvh, hd, 0), (k_new, new.name)),
           ("vq", kernel("kv_quant", rows, kvh, hd, 1), (v_new, new.name))]
    if rows == 1:
        return (kernel("attention_kv8", 1, window, heads, kvh, hd, **extra), (q, ctx.name, POS, op.out),
                [new, ctx, pos], tuple(pre))
    kd = Arg("k_deq", (window, kvh * hd), Role.STATE, graph.dtype, state=KV8_K_SCRATCH)
    vd = Arg("v_deq", (window, kvh * hd), Role.STATE, graph.dtype, state=KV8_V_SCRATCH)
    pre.append(("deq", kernel("kv_dequant", window, kvh, hd), (ctx.name, kd.name, vd.name)))
    return (kernel("attention", rows, window, heads, kvh, hd, **extra), (q, kd.name, vd.name, POS, op.out),
            [new, ctx, kd, vd, pos], tuple(pre))
