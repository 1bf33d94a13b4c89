"""The decode token as ONE module: the embedding row, every layer, the LM head and the on-device top-k (greedy:
k = 1, the argmax), derived from the model's own per-layer decode plan and LM head (graph.lower), so nothing of
a layer is described twice.

Per token the host passes two scalars, the token id and its position, and reads the k best (id, logit) pairs
(8·k bytes): the embedding row is a window of the `embed` state at row `token` (a sub-buffer: the DMA reads the
row at the token's address, the instruction stream stays static), each layer's K/V append is a window of its
cache at row `pos`, attention masks past `pos` over the module's KV window (one module per window, as the
per-layer decode; mlir-air's fused decode patches the same two position-dependent words into its instruction
stream instead). Each layer's arguments bind that layer's buffer set (`Arg.bo_key`): its weights are the very
buffers the per-layer modules use (`Arg.shares`) and its KV cache is the layer's.
"""
from __future__ import annotations

from multi_launch_builder.decl import Arg, Launch, ModuleDecl, Role
from kernel_builder.gemv_q4.format import Q4Layout
from kernel_builder.registry import kernel

from .graph import POS, layer_plan
from .llama import VOCAB
from .lowering import Q4_GROUP

TOKEN = "token"        # the scalar holding the token id: the embedding row the module reads
EMBED = "embed"        # the state holding the embedding rows [vocab, hidden] (one buffer for all layers)
EMBED_ROW = "embed_row"
CAND_INIT = "cand_init"   # the chain's first candidates: none (a static, written once)
NEXT = "next"          # the output: k ids then their f32 logits (bit patterns), best first
TOKEN_FAMILY = "token"


def token_module_name(kv_rows: int, k: int = 1) -> str:
    return f"token_kv{kv_rows}" + (f"_k{k}" if k > 1 else "")


def unsupported(model) -> str:
    """Why the model's decode cannot be one module ("" when it can): the host hooks that change the embedding
    rows or the logits, and layer variants, have no on-device form here."""
    from .llama import LlamaModel
    cls = type(model)
    if cls.embed_rows is not LlamaModel.embed_rows or cls.final_logits is not LlamaModel.final_logits:
        return f"{cls.__name__} scales the embedding rows or the logits on the host"
    if len(model.layer_variants) > 1:
        return f"{cls.__name__} has layer variants"
    if model.tied and model.head_weights not in ("bf16", "q4"):
        return f"its embedding rows are the {model.head_weights} LM head's (no on-device dequantization of those)"
    return ""


def embed_q4(model) -> bool:
    """An untied model's embedding rows on the device in 4 bits (q4 rows of group Q4_GROUP with mins, rounded to
    nearest from the checkpoint's rows, llama_npu.weights.Q4EmbedRows): with 4-bit weights; bf16 otherwise."""
    return not model.tied and model.weights == "q4"


def embed_row_args(model) -> tuple[int, str]:
    """(bytes, element type) of one row of the EMBED state (an untied model's embedding rows)."""
    h = model.shapes.hidden
    return (Q4Layout(h, Q4_GROUP, True).row_bytes, "i8") if embed_q4(model) else (2 * h, "bf16")


def _embedding(model, head: ModuleDecl) -> tuple[list[Arg], list[Launch]]:
    """The token's embedding row `embed_row` bf16 [1, hidden]: tied, a window of the VOCAB state (the LM head's
    rows) at the token, dequantized on the core when those rows are 4-bit; untied, a window of the EMBED state,
    dequantized on the core when the model's weights are 4-bit (embed_q4)."""
    h = model.shapes.hidden
    if not model.tied:
        if not embed_q4(model):
            return [Arg(EMBED_ROW, (1, h), Role.STATE, "bf16", state=EMBED, at=TOKEN)], []
        row = Arg("embed_q4", (1, embed_row_args(model)[0]), Role.STATE, "i8", state=EMBED, at=TOKEN)
        return ([row, Arg(EMBED_ROW, (1, h), Role.INTERMEDIATE, "bf16")],
                [Launch("embed", kernel("dequant_q4", 1, h, Q4_GROUP, 1), (row.name, EMBED_ROW))])
    lm = next(a for a in head.args if a.role is Role.STATE and a.state_name == VOCAB)
    if lm.dtype == "bf16":
        return [Arg(EMBED_ROW, (1, h), Role.STATE, "bf16", state=VOCAB, at=TOKEN)], []
    row = Arg("embed_q4", (1,) + lm.shape[1:], Role.STATE, lm.dtype, state=VOCAB, at=TOKEN)
    return ([row, Arg(EMBED_ROW, (1, h), Role.INTERMEDIATE, "bf16")],
            [Launch("embed", kernel("dequant_q4", 1, h, getattr(model, "head_group", Q4_GROUP), 1),
                    (row.name, EMBED_ROW))])


def _layer_args(decl: ModuleDecl, layer: int, x_name: str) -> tuple[dict[str, str], list[Arg]]:
    """The layer module's arguments in the token module: renamed `l<L>_<name>`, bound to the layer's buffers."""
    bo = f"L{layer}"
    names, args = {}, []
    for a in decl.args:
        if a.role is Role.INPUT:
            names[a.name] = x_name
            continue
        if a.role is Role.SCALAR:
            names[a.name] = a.name
            continue
        n = names[a.name] = f"l{layer}_{a.name}"
        if a.role is Role.STATIC:
            args.append(Arg(n, a.shape, Role.STATIC, a.dtype, bo_key=bo, shares=(decl.static_group, a.name)))
        elif a.role is Role.STATE:
            args.append(Arg(n, a.shape, Role.STATE, a.dtype, state=a.state_name, at=a.at, bo_key=bo))
        else:
            args.append(Arg(n, a.shape, Role.INTERMEDIATE, a.dtype))
    return names, args


def token_module(model, kv_rows: int, k: int = 1) -> ModuleDecl:
    """`token_kv<kv_rows>[_k<k>]`: n_layers fused decode layers + final RMSNorm + LM-head GEMVs + a topk chain
    over the vocabulary partitions."""
    why = unsupported(model)
    if why:
        raise ValueError(f"one-module decode: {why}")
    s = model.shapes
    plans = model._per_layer(lambda v: model.decode(kv_rows, v))
    head = model.head().decls[0]
    args, launches = _embedding(model, head)
    x_name = EMBED_ROW
    extra: dict[str, None] = {}   # the layers' other scalars (a sliding window's KV0 / KV_POS: graph.call_scalars)
    for layer in range(s.n_layers):
        plan = layer_plan(plans, layer)
        if len(plan.steps) != 1 or plan.steps[0].decl is None:
            raise ValueError("one-module decode needs the fused per-layer decode module (NPU attention)")
        decl = plan.steps[0].decl
        names, largs = _layer_args(decl, layer, x_name)
        # the position (or, sliding, the position within the window), once
        args += [a for a in decl.args if a.role is Role.SCALAR and all(a.name != b.name for b in args)]
        extra.update(dict.fromkeys(n for n in decl.scalars if n != POS))
        args += largs
        launches += [Launch(f"l{layer}_{la.prefix}", la.build, tuple(names[w] for w in la.wiring))
                     for la in decl.launches]
        x_name = names[plan.output[1]]
    rows = model.lm_rows
    parts = [p for p in range(model.lm_parts) if s.vocab > p * rows]   # a partition of padding only is dropped
    dropped = {f"logits_{p}" for p in range(model.lm_parts) if p not in parts}
    dropped |= {w for la in head.launches if la.wiring[-1] in dropped for w in la.wiring[:-1] if w.startswith("lm_")}
    hnames = {}
    for a in head.args:
        if a.name in dropped:
            continue
        if a.role is Role.INPUT:
            hnames[a.name] = x_name
        elif a.role is Role.STATIC:
            hnames[a.name] = a.name
            args.append(Arg(a.name, a.shape, Role.STATIC, a.dtype, bo_key=head.name,
                            shares=(head.static_group, a.name)))
        elif a.role is Role.STATE:      # an LM-head partition: a window of the VOCAB state
            hnames[a.name] = a.name
            args.append(a)
        else:
            hnames[a.name] = f"head_{a.name}"
            args.append(Arg(hnames[a.name], a.shape, Role.INTERMEDIATE, a.dtype))
    launches += [Launch(f"head_{la.prefix}", la.build, tuple(hnames[w] for w in la.wiring)) for la in head.launches
                 if la.wiring[-1] not in dropped]
    args.append(Arg(CAND_INIT, (1, 2 * k), Role.STATIC, "i32"))
    prev = CAND_INIT
    for p in parts:
        valid = min(rows, s.vocab - p * rows)
        out = NEXT if p == parts[-1] else f"cand_{p}"
        args.append(Arg(out, (1, 2 * k), Role.OUTPUT if out == NEXT else Role.INTERMEDIATE, "i32"))
        launches.append(Launch(f"top{p}", kernel("topk", rows, k, p * rows, valid),
                               (hnames[f"logits_{p}"], prev, out)))
        prev = out
    return ModuleDecl(token_module_name(kv_rows, k), tuple(args), tuple(launches), family=TOKEN_FAMILY,
                      scalars=(POS, TOKEN, *extra))
