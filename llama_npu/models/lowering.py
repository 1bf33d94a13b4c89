"""Lowering rules: which kernel computes a graph op in a phase, how it is wired, which arguments it adds.

One rule per op kind (`RULES[kind](op, phase, graph) -> (kernel factory, wiring, extra Args)`); wiring names
follow the kernel's canonical argument order (kernel_builder.registry.SIGNATURES). Weight arguments are the
Hugging Face `[out, in]` tensors as stored: both `linear` kernels (GEMV for one row, GEMM for more: c = a·wᵀ)
read `<w>`, so prefill and decode share one device buffer per weight.
"""
from __future__ import annotations

from multi_launch_builder.decl import Arg, Role
from kernel_builder.registry import kernel

from kernel_builder import block_float
from kernel_builder.gemm_q4.plan import prefer_l1
from kernel_builder.gemv_q4.format import Q4Layout

from .graph import ACTIVATION_FORMATS, KV0, KV_POS, POS, LayerGraph, Op, Phase, is_activation

Q4_SUFFIX = "_q4"    # the static argument of a weight in the 4-bit row format
Q8_SUFFIX = "_q8"    # the same layout with 8-bit codes (a GGUF's Q8_0 LM head)
BFP_SUFFIX = "_bfp"  # the static argument of a weight at rest in block float (kernel_builder/block_float.py)
Q4_GROUP = 32        # GGUF Q4_0/Q4_1 blocks and `--weights q4` (round to nearest per group); AWQ/GPTQ: 128
DEQ_SUFFIX = "_deq"  # a q4 prefill GEMM's bf16 weight: a window of the scratch state of its k
SCRATCH_PREFIX = "wdeq_k"   # the scratch states (one per input width k), each ONE buffer for every layer


def _static(name: str, shape, graph: LayerGraph) -> Arg:
    return Arg(name, tuple(shape), Role.STATIC, graph.dtype)


def _bfp(name: str, n: int, k: int) -> Arg:
    """Weight `name` [n, k] at rest in block float: `<name>_bfp`, bytes [n/8, 9k] (kernel_builder/block_float.py)."""
    return Arg(name + BFP_SUFFIX, block_float.shape(n, k), Role.STATIC, "i8")


def _bfp_kw(graph: LayerGraph, **tensors) -> dict:
    """The format keywords (a="bfp16", c="bfp16", out="bfp16") of the tensors this phase keeps in block float."""
    return {k: "bfp16" for k, t in tensors.items() if graph.act_format(t) == "bfp16"}


# GEMM phases with block-float weights keep an activation in block float (bytes [rows/8, 9*width], the weights'
# format) when its producer can write it so and every reader is a GEMM taking it as its A operand: the GEMMs then
# read 9/16 of the bytes and convert nothing in the core. The values are the ones the GEMMs' in-core conversion of
# the bf16 activation makes today (block_float.encode of the bf16-rounded result).
BFP_WRITERS = ("rmsnorm", "linear_swiglu")   # rmsnorm(out="bfp16"), gemm_bfp(c="bfp16")
BFP_READERS = ("linear", "linear_swiglu")    # gemm_bfp(a="bfp16"): the activation is ins[0]


def activation_formats(ops: list[Op], phase: Phase, graph: LayerGraph) -> dict[str, str]:
    """{activation: "bfp16"} for the phase's ops (every segment's, fused): see BFP_WRITERS / BFP_READERS. None in
    a decode phase (one row: the GEMVs round their input themselves) or with other weights."""
    if graph.weights != "bfp16" or phase.rows == 1:
        return {}
    readers: dict[str, list[tuple[Op, int]]] = {}
    for op in ops:
        for i, t in enumerate(op.ins):
            if is_activation(t):
                readers.setdefault(t, []).append((op, i))
    out = {}
    for op in ops:
        if op.into or op.kind not in BFP_WRITERS or op.out in graph.outputs or op.params.get("group") \
                or (op.kind == "linear_swiglu" and len(op.ins) != 2):
            continue
        rs = readers.get(op.out, [])
        if rs and all(r.kind in BFP_READERS and i == 0 for r, i in rs):
            out[op.out] = "bfp16"
    return out


def rmsnorm(op: Op, phase: Phase, graph: LayerGraph):
    x, w = op.ins
    group, offset = op.params.get("group", 0), op.params.get("offset", 0)
    extra = {**({"group": group} if group else {}), **({"offset": offset} if offset else {}),
             **_bfp_kw(graph, out=op.out)}
    build = kernel("rmsnorm", phase.rows, op.width, op.params["eps"], **extra)
    return build, (x, w.name, op.out), [_static(w.name, (group or op.width,), graph)]


def linear(op: Op, phase: Phase, graph: LayerGraph):
    """One row: GEMV, more rows: GEMM, both on the HF [out, in] weight (one buffer for both phases). With q4
    weights both read `<w>_q4`, the weight in the 4-bit row format (group graph.q4_group, mins;
    docs/quantization.md): the GEMV dequantizes in the core; a GEMM is `gemm_q4` (dequantizing its W slices in L1)
    where the counted cost model times it below the other way (kernel_builder.gemm_q4.plan.prefer_l1), else it is
    preceded by a `dequant_q4` launch writing the bf16 weight into rows [0, n) of the scratch state `wdeq_k<k>` (one
    buffer shared by every layer, module and bucket), which it then reads: the device holds no bf16 copy of the
    weights either way. With block-float weights both read `<w>_bfp` (kernel_builder/block_float.py): gemv_bfp and
    gemm_bfp consume the blocks as the matrix unit's operands, with no conversion on the device."""
    x, w = op.ins
    n, k = op.width, graph.width(x)
    weight = [_static(w.name, (n, k), graph)]
    if graph.weights == "q8" and phase.rows == 1:    # a GGUF's Q8_0 vocabulary matrix: 8-bit codes, no mins
        name = w.name + Q8_SUFFIX
        q8 = Arg(name, (n, Q4Layout(k, Q4_GROUP, False, 8).row_bytes), Role.STATIC, "i8")
        return kernel("gemv_q4", n, k, Q4_GROUP, 0, 8), (name, x, op.out), [q8]
    if graph.weights == "q4":
        g = graph.q4_group
        name = w.name + Q4_SUFFIX
        q4 = Arg(name, (n, Q4Layout(k, g, True).row_bytes), Role.STATIC, "i8")
        if phase.rows == 1:
            return kernel("gemv_q4", n, k, g, 1), (name, x, op.out), [q4]
        if prefer_l1(phase.rows, k, n, g):    # the GEMM dequantizing its W slices in L1: no scratch
            return kernel("gemm_q4", phase.rows, k, n, g), (x, name, op.out), [q4]
        deq = Arg(w.name + DEQ_SUFFIX, (n, k), Role.STATE, graph.dtype, state=f"{SCRATCH_PREFIX}{k}")
        return (kernel("gemm", phase.rows, k, n), (x, deq.name, op.out), [q4, deq],
                (("deq", kernel("dequant_q4", n, k, g, 1), (name, deq.name)),))
    if graph.weights == "bfp16":
        b = _bfp(w.name, n, k)
        if phase.rows == 1:
            return kernel("gemv_bfp", n, k), (b.name, x, op.out), [b]
        return kernel("gemm_bfp", phase.rows, k, n, **_bfp_kw(graph, a=x, c=op.out)), (x, b.name, op.out), [b]
    if phase.rows == 1:
        return kernel("gemv", n, k), (w.name, x, op.out), weight
    return kernel("gemm", phase.rows, k, n), (x, w.name, op.out), weight


def linear_swiglu(op: Op, phase: Phase, graph: LayerGraph):
    """silu(x . w_gate^T) * (x . w_up^T) in one launch: a GEMM phase's gemm_swiglu (models/fusion.py) on the [2n, k]
    gate/up weight interleaved by 8 rows the decode GEMV reads too (kernel_builder/gemm_swiglu/layout.py), or a
    4-bit decode's gemv_q4_swiglu on separate gate and up weights (op ins (x, w_gate, w_up): fuse_gate_up_swiglu)."""
    x = op.ins[0]
    n, k = op.width, graph.width(x)
    if len(op.ins) == 3:
        if phase.rows != 1 or graph.weights != "q4":
            raise ValueError(f"linear_swiglu with separate gate and up weights is a 4-bit decode op ({op.out})")
        g = graph.q4_group
        q4 = [Arg(w.name + Q4_SUFFIX, (n, Q4Layout(k, g, True).row_bytes), Role.STATIC, "i8") for w in op.ins[1:]]
        return kernel("gemv_q4_swiglu", n, k, g, 1), (q4[0].name, q4[1].name, x, op.out), q4
    w = op.ins[1]
    if graph.weights == "bfp16":     # the same interleaved [2n, k] weight, at rest in block float
        b = _bfp(w.name, 2 * n, k)
        fmt = _bfp_kw(graph, a=x, c=op.out)
        return kernel("gemm_bfp", phase.rows, k, n, "swiglu", **fmt), (x, b.name, op.out), [b]
    return kernel("gemm_swiglu", phase.rows, k, n), (x, w.name, op.out), [_static(w.name, (2 * n, k), graph)]


def linear_bias(op: Op, phase: Phase, graph: LayerGraph):
    """x . w^T + b in one GEMM launch (models/fusion.py; GEMM phases only)."""
    x, w, b = op.ins
    n, k = op.width, graph.width(x)
    if graph.weights == "bfp16":
        raise ValueError(f"linear_bias ({op.out}): the fused GEMM bias epilogue has no block-float form (the "
                         f"default fusions keep a GEMM and a bias_add launch)")
    return (kernel("gemm_bias", phase.rows, k, n), (x, w.name, b.name, op.out),
            [_static(w.name, (n, k), graph), _static(b.name, (1, n), graph)])


def scratch_states(decls) -> dict[str, int]:
    """The scratch states of these modules (the q4 prefill's weights, the KV8 prefill's dequantized K / V windows,
    models/kv8.py): state name -> rows (the most any window needs)."""
    out: dict[str, int] = {}
    for d in decls:
        for a in d.args:
            if a.role is Role.STATE and a.state_name.startswith((SCRATCH_PREFIX, "kv8_deq_")):
                out[a.state_name] = max(out.get(a.state_name, 0), a.shape[0])
    return out


def bias_add(op: Op, phase: Phase, graph: LayerGraph):
    """A projection's bias (the HF [out] vector, a [1, out] static) added to each of the call's rows."""
    x, b = op.ins
    return kernel("bias_add", phase.rows, op.width), (x, b.name, op.out), [_static(b.name, (1, op.width), graph)]


def fuse_linear_bias(lin: Op, add: Op, phase: Phase, graph: LayerGraph) -> Op | None:
    """A decode projection (GEMV, bf16 or 4-bit) and its bias_add: one `linear_bias` op (the GEMV with the bias
    epilogue); prefill (GEMM) keeps the two launches."""
    if phase.rows != 1 or graph.weights not in ("bf16", "q4", "bfp16") or add.ins[0] != lin.out:
        return None
    return Op("linear_bias", (*lin.ins, add.ins[1]), add.out, add.width, into=add.into)


def fuse_linear_residual(lin: Op, add: Op, phase: Phase, graph: LayerGraph) -> Op | None:
    """A decode projection (GEMV, bf16 or 4-bit) and the residual add reading it: one `linear_bias` op whose bias
    is the residual activation (the GEMV's epilogue adds it to the f32 accumulator before the one bf16 rounding;
    the separate add rounded the product first); prefill (GEMM) keeps the two launches."""
    if phase.rows != 1 or graph.weights not in ("bf16", "q4", "bfp16") or add.into:
        return None
    (other,) = [t for t in add.ins if t != lin.out] or [None]
    if other is None or not is_activation(other) or graph.width(other) != lin.width:
        return None
    return Op("linear_bias", (*lin.ins, other), add.out, add.width)


def fuse_gate_up_swiglu(up: Op, act: Op, phase: Phase, graph: LayerGraph) -> Op | None:
    """A 4-bit decode's swiglu(linear(x, w_gate), linear(x, w_up)), met at (up projection, swiglu): one
    `linear_swiglu` op (gemv_q4_swiglu: each tile streams its gate rows then its up rows and writes the SwiGLU of
    its rows); the gate projection, read by the swiglu alone, is dropped (graph._fuse). bf16 decode and prefill
    keep their launches."""
    if phase.rows != 1 or graph.weights != "q4" or act.into or act.ins[1] != up.out:
        return None
    gate = next((o for o in graph.ops if o.out == act.ins[0] and not o.into), None)
    if gate is None or gate.kind != "linear" or gate.ins[0] != up.ins[0] \
            or not gate.width == up.width == act.width:
        return None
    return Op("linear_swiglu", (up.ins[0], gate.ins[1], up.ins[1]), act.out, act.width)


def linear_bias_row(op: Op, phase: Phase, graph: LayerGraph):
    """A `linear_bias` op (y = x·wᵀ + b): of one row, the GEMV with the bias epilogue, reading the same weight as
    `linear` (the HF [out, in] tensor, or its 4-bit rows `<w>_q4`), the bias a [1, out] static; of more rows,
    the GEMM's (`linear_bias`)."""
    if phase.rows != 1:     # a GEMM phase's linear_bias (models/fusion.py): gemm_bias
        return linear_bias(op, phase, graph)
    x, w, b = op.ins
    n, k = op.width, graph.width(x)
    # the bias: a [1, out] static, or an activation (a residual: an INPUT or an earlier op's output)
    bias, b_name = ([], b) if is_activation(b) else ([_static(b.name, (1, n), graph)], b.name)
    if graph.weights == "q4":
        g = graph.q4_group
        name = w.name + Q4_SUFFIX
        return (kernel("gemv_q4_bias", n, k, g, 1), (name, x, b_name, op.out),
                [Arg(name, (n, Q4Layout(k, g, True).row_bytes), Role.STATIC, "i8"), *bias])
    if graph.weights == "bfp16":
        wb = _bfp(w.name, n, k)
        return kernel("gemv_bfp_bias", n, k), (wb.name, x, b_name, op.out), [wb, *bias]
    return kernel("gemv_bias", n, k), (w.name, x, b_name, op.out), [_static(w.name, (n, k), graph), *bias]


def rope(op: Op, phase: Phase, graph: LayerGraph):
    """The RoPE table is a state (one row per position, written once); the call reads its rows [pos, pos+rows)."""
    x, table = op.ins
    hd = graph.states[table.name]
    heads = op.width // hd
    lut = Arg("lut", (phase.rows, hd), Role.STATE, graph.dtype, state=table.name, at=POS)
    return kernel("rope", phase.rows, heads, hd), (x, "lut", op.out), [lut]


def attention(op: Op, phase: Phase, graph: LayerGraph):
    """Causal GQA attention of the call's rows (at positions pos..pos+rows-1, the scalar) over the KV-cache
    window of positions [0, kv_rows): the same kernel for a prefill chunk (any position) and for decode. A
    sliding phase (a window of keys past which the call reads nothing) binds the cache rows [kv0, kv0 + kv_rows)
    and passes the position within them (graph.call_scalars)."""
    if op.params.get("kv") == "int8":          # the KV8 cache (models/kv8.py)
        from .kv8 import attention as kv8_attention
        return kv8_attention(op, phase, graph)
    q, kc, vc = op.ins
    hd, heads, kv_heads = op.params["head_dim"], op.params["heads"], op.params["kv_heads"]
    rows, window = phase.rows, phase.kv_rows
    # a sliding window of keys (None: full causal) and the softmax-scale dimension (None: head_dim), when set
    extra = {k: op.params[k] for k in ("window", "scale_dim") if op.params.get(k)}
    # a sliding phase: the window is cache rows [KV0, KV0 + kv_rows) and the kernel's position is KV_POS in it
    at, p = (KV0, KV_POS) if phase.slide else ("", POS)
    k = Arg("k_ctx", (window, kv_heads * hd), Role.STATE, graph.dtype, state=kc.name, at=at)
    v = Arg("v_ctx", (window, kv_heads * hd), Role.STATE, graph.dtype, state=vc.name, at=at)
    pos = Arg(p, (1,), Role.SCALAR, "i32")
    return (kernel("attention", rows, window, heads, kv_heads, hd, **extra), (q, "k_ctx", "v_ctx", p, op.out),
            [k, v, pos])


def add(op: Op, phase: Phase, graph: LayerGraph):
    a, b = op.ins
    return kernel("add", phase.rows, op.width), (a, b, op.out), []


def swiglu(op: Op, phase: Phase, graph: LayerGraph):
    """Two inputs: gate and up. One input: the (gate, up) pairs of `pairs` elements of one [rows, 2*width]
    tensor (the interleaved gate/up projection's output), passed as both operands."""
    if len(op.ins) == 1:
        (gu,) = op.ins
        return kernel(op.kind, phase.rows, op.width, pairs=op.params["pairs"]), (gu, gu, op.out), []
    g, u = op.ins
    return kernel(op.kind, phase.rows, op.width), (g, u, op.out), []


RULES = {"rmsnorm": rmsnorm, "linear": linear, "linear_swiglu": linear_swiglu, "linear_bias": linear_bias_row,
         "bias_add": bias_add, "rope": rope, "attention": attention, "add": add,
         "swiglu": swiglu, "geglu": swiglu,
         # epilogue fusions (graph._fuse): (first op kind, second op kind) -> the fused op, or None in a phase
         ("linear", "bias_add"): fuse_linear_bias, ("linear", "add"): fuse_linear_residual,
         ("linear", "swiglu"): fuse_gate_up_swiglu,
         ACTIVATION_FORMATS: activation_formats}
