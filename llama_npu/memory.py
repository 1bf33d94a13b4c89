"""How much memory a model run holds: device buffers from the module declarations plus the device states
(KV cache, RoPE table) for a context of `context` positions.

Follows the ModuleExecutor's sharing rules (docs/cache.md, "Buffer sharing"): a static buffer belongs to
(module family, bo_key, arg name, shape, dtype), so a layer's weights are counted once however many
modules share them, input/intermediate/output/scalar buffers belong to the module, once for all its
bo_keys, and a state has one buffer per layer (KV cache) or one in all (RoPE table). The bo_keys are the
Engine's: one per layer, and one for the LM head.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from multi_launch_builder.decl import Role

from .models import LlamaModel, model_for
from .models.llama import ModelShapes

BF16_BYTES = 2


@dataclass(frozen=True)
class MemoryPlan:
    weights_bytes: int      # every static device buffer: layer weights, final norm, LM-head partitions
    kv_cache_bytes: int     # device states: K and V of every layer + the RoPE table, `context` positions
    activation_bytes: int   # input / intermediate / output / scalar device buffers, one set per module
    scratch_bytes: int = 0  # q4 prefill: the bf16 weight scratch states (one buffer per input width, all layers)
    embed_bytes: int = 0    # of weights_bytes: the rows held as states (LM head; an untied model's embedding)

    @property
    def total(self) -> int:
        return self.weights_bytes + self.kv_cache_bytes + self.activation_bytes + self.scratch_bytes


def plan_memory(cfg_or_shapes, buckets: Iterable[int], context: int, decode_attention: str = "npu",
                weights: str = "bf16", q4_group: int | None = None, kv: str = "bf16",
                tied: bool | None = None) -> MemoryPlan:
    """Bytes a run of this model needs with these prefill buckets and device states of `context` positions.

    `cfg_or_shapes` is a ModelConfig (its family's description; buckets filtered to the model's context, as
    Engine.load does) or bare ModelShapes (a Llama; buckets used as given). `weights="q4"`: the 4-bit run (every
    linear weight and the LM head in q4 rows of `q4_group`, default the model's; the prefill scratch apart).
    `tied` overrides whether the LM head is the embedding (bare shapes: tied unless told; untied, the one-dispatch
    decode holds the embedding rows too, in q4 with 4-bit weights)."""
    from .config import select_buckets
    from .models.lowering import scratch_states

    if isinstance(cfg_or_shapes, ModelShapes):
        shapes, bs = cfg_or_shapes, tuple(sorted({int(b) for b in buckets}))
        model = LlamaModel(shapes, weights, kv=kv)
    else:
        shapes, bs = cfg_or_shapes.shapes, select_buckets(buckets, cfg_or_shapes.max_position)
        model = model_for(cfg_or_shapes, weights, kv)
    if q4_group:
        model.q4_group = model.head_group = q4_group
    if tied is not None:
        model.tied = tied
    if isinstance(context, bool) or not isinstance(context, int) or context <= 0:
        raise ValueError(f"context must be a positive number of positions, got {context!r}")
    if not bs or min(bs) <= 0:
        raise ValueError(f"prefill buckets must be positive integers, got {list(buckets)}")
    from .token_decode import token_decls

    statics: dict[tuple, int] = {}
    activations = 0
    head = model.head().decls[0].name
    decls = model.modules(bs, context, decode_attention)
    tokens = token_decls(model, model.kv_windows(context), decode_attention == "npu")   # one-dispatch decode
    for decl in decls + tokens:
        # one weight set per layer (the engine's bo_keys); the token modules name theirs per argument
        bo_keys = [decl.name] if decl.name == head or decl in tokens else [f"L{i}" for i in range(shapes.n_layers)]
        for a in decl.args:
            if a.role is Role.STATIC:
                group, name = a.shares or (decl.static_group, a.name)
                for k in ([a.bo_key] if a.bo_key else bo_keys):
                    statics[(group, k, name, a.shape, a.dtype)] = a.nbytes
            elif a.role is not Role.STATE:
                activations += a.nbytes
    # the LM head's rows (the VOCAB state), and an untied model's embedding rows for the token modules
    from .models.llama import VOCAB
    embed = sum(a.nbytes for a in model.head().decls[0].args if a.role is Role.STATE and a.state_name == VOCAB)
    if tokens and not model.tied:
        from .models.token import embed_row_args
        embed += shapes.vocab * embed_row_args(model)[0]     # bf16, or q4 rows with 4-bit weights
    widths = {a.state_name: a.row_nbytes for d in decls for a in d.args if a.role is Role.STATE}
    states = 0
    for name, width in model.graph.states.items():   # a state's row bytes as its modules declare it (KV8: int8)
        per = 1 if name in model.shared_states else shapes.n_layers
        states += per * context * widths.get(name, width * BF16_BYTES)
    scratch = sum(rows * widths[name] for name, rows in scratch_states(decls).items())
    return MemoryPlan(sum(statics.values()) + embed, states, activations, scratch, embed)


from .sizes import DEFAULT_CONTEXT_CAP, context_tiles  # noqa: E402 (positions the KV cache is planned for without --context)
KV_SHARE = 0.5                # of the memory left after weights and activations, what the KV cache may take


def available_bytes() -> int | None:
    """MemAvailable of this machine (the NPU's buffers are host memory too), or None when unknown."""
    from multi_launch_builder.doctor import Machine
    from multi_launch_builder.doctor.limits import read_meminfo

    return read_meminfo(Machine.local()).get("MemAvailable")


def fmt(n: int) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB"


def choose_context(cfg, buckets: Iterable[int], requested: int | None = None,
                   available: int | None = None, decode_attention: str = "npu", weights: str = "bf16",
                   kv: str = "bf16") -> int:
    """The context (KV-cache positions) of a run, checked against memory before any weight is read.

    `requested` (--context) is validated against the model's context and the available memory; without it,
    the largest power of two <= min(model context, DEFAULT_CONTEXT_CAP) whose attention the kernels tile
    (sizes.context_tiles) and whose KV cache takes at most KV_SHARE of what the weights and activations leave
    (the model's own context when it is smaller). ContextError
    (one line, with a --context that fits) when even that cannot fit."""
    from .errors import ContextError

    limit = cfg.max_position
    if requested is not None:
        if isinstance(requested, bool) or not isinstance(requested, int) or requested <= 0:
            raise ContextError(f"--context must be a positive number of positions, got {requested!r}")
        if requested > limit:
            raise ContextError(f"--context {requested} exceeds the model's context of {limit} positions")
        ctx = requested
        model = model_for(cfg, weights, kv)
        if not context_tiles(model, ctx):
            fits = 1 << ((ctx - 1).bit_length() - 1)
            while fits > 256 and not context_tiles(model, fits):
                fits //= 2
            raise ContextError(f"--context {ctx}: the attention kernel cannot tile this model's decode over "
                               f"{model.kv_windows(ctx)[-1]} cached positions yet; pass --context {fits}")
    else:
        ctx = min(limit, DEFAULT_CONTEXT_CAP)
        model = model_for(cfg, weights, kv)
        while ctx > 256 and not context_tiles(model, ctx):   # what the kernels can tile
            ctx = 1 << ((ctx - 1).bit_length() - 1)
        while available is not None and ctx > 256:
            plan = plan_memory(cfg, buckets, ctx, decode_attention, weights, kv=kv)
            if plan.kv_cache_bytes <= KV_SHARE * (available - plan.weights_bytes - plan.activation_bytes):
                break
            ctx = 1 << ((ctx - 1).bit_length() - 1)        # the next smaller power of two
    if available is not None:
        plan = plan_memory(cfg, buckets, ctx, decode_attention, weights, kv=kv)
        if plan.total > available:
            fixed = plan.weights_bytes + plan.activation_bytes
            fits = (available - fixed) * ctx // plan.kv_cache_bytes if available > fixed else 0
            hint = f"pass --context {fits}" if fits >= 64 else "use a smaller model or fewer prefill buckets"
            raise ContextError(
                f"the model needs {fmt(plan.total)} (weights {fmt(plan.weights_bytes)} + KV cache "
                f"{fmt(plan.kv_cache_bytes)} for {ctx} positions + activations {fmt(plan.activation_bytes)}) but "
                f"only {fmt(available)} is available: {hint}")
    return ctx
