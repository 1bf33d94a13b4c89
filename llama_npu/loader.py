"""Loading, separate from running: checkpoint -> config and tokenizer -> memory plan -> weights -> every kernel
module built or reused -> the executor (multi_launch_builder.executor, the KernelCache) bound to them -> an
Engine; then every static written to its device buffer and (warmup) one untimed prefill + decode step."""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

from multi_launch_builder.decl import Role

from .config import load_config, select_buckets
from .model_source import resolve_model
from .models.graph import HEAD_PLAN, layer_plan
from .models.token import TOKEN_FAMILY
from .sizes import DEFAULT_BUCKETS
from .token_decode import write_vocab
from .tokenizer import Tokenizer
from .walk import layer_key
from .weights import ModelWeights

HANDOFFS = ("device", "host")


def load_engine(cls, model: str | None = None, device: str = "auto", buckets: Sequence[int] = DEFAULT_BUCKETS,
                cache_dir: str | Path | None = None, progress: bool = True, warmup: bool = True,
                handoff: str = "device", context: int | None = None, decode_attention: str = "npu",
                weights_mode: str = "bf16", kv: str = "bf16"):
    """Resolve the model, validate it (config before any weight), choose the context (--context, else
    what the machine's memory allows) and check the whole memory plan before anything is allocated,
    build or reuse every kernel module, read all weights straight into their device buffers and
    (warmup) run one untimed prefill and decode step, so one-time device work stays out of the first
    timed request. `cls`: the Engine class to construct (Engine.load passes its own)."""
    from multi_launch_builder.compile import build_modules
    from multi_launch_builder.executor import ModuleExecutor as KernelCache
    from multi_launch_builder.devices import make_device

    from .embedded import cache_root, gguf_source
    from .memory import available_bytes, choose_context
    from .models import model_for
    from .sizes import check_model_sizes, kernel_sizes, plan_modules

    if handoff not in HANDOFFS:
        raise ValueError(f"handoff must be one of {HANDOFFS}, got {handoff!r}")
    if kv != "bf16" and decode_attention == "host":
        raise ValueError(f"--kv {kv} needs the decode attention on the NPU (--decode-attention npu)")
    model_dir = resolve_model(model, progress=progress)
    cfg = load_config(model_dir)
    tokenizer = Tokenizer(model_dir)
    dev = make_device(device)
    check_model_sizes(cfg)      # every size the kernels constrain, before the checkpoint is opened
    avail = available_bytes() if getattr(dev, "name", "") in ("npu", "emu", "emu-interp") else None
    with kernel_sizes(cfg):     # the memory plan declares every module
        ctx = choose_context(cfg, select_buckets(buckets, cfg.max_position), context, avail, decode_attention,
                             weights_mode, kv)
    bs = select_buckets(buckets, ctx)
    described = model_for(cfg, weights_mode, kv)
    # headers + shapes checked; data is read straight into device buffers (q4: docs/quantization.md; the
    # weights decide whether a q4 run's LM head is 4-bit, so they are opened before the modules are planned)
    weights = ModelWeights(cfg, described, weights=weights_mode,
                           gguf=gguf_source(model_dir) if weights_mode == "q4" else None)
    decls = plan_modules(described, cfg, bs, ctx, decode_attention)   # every kernel planned (sizes past a budget)
    kind = getattr(dev, "name", "emu")
    cache_dir = Path(cache_dir) if cache_dir else cache_root() / "kernels"
    lazy = {d.name for d in decls if d.family == TOKEN_FAMILY}   # a one-module token: built when first decoded
    report = build_modules([d for d in decls if d.name not in lazy], cache_dir, kind, progress=progress)
    cache = KernelCache(dev, report.artifacts, decls, handoff=handoff)
    eng = cls(cfg, tokenizer, weights, cache, bs, ctx, decode_attention)
    if eng.token_decode is not None:
        eng.token_decode.build = lambda d: build_modules([d], cache_dir, kind, progress=False).artifacts[d.name]
    preload(eng, progress=progress)
    if warmup:
        warm_up(eng)
    return eng


def preload(eng, progress: bool = True) -> None:
    """Write every static (each layer's weights once for all its modules, the LM head) before any timed
    call, each tensor read from the checkpoint straight into its device buffer."""
    from tqdm import tqdm

    c, w = eng.cache, eng.weights
    layer_plans = [plan for key, plan in eng.plans.items() if key != HEAD_PLAN]
    for layer in tqdm(range(eng.shapes.n_layers), desc="uploading weights", unit="layer",
                      disable=not progress, leave=False):
        decls = {d.name: d for plan in layer_plans for d in layer_plan(plan, layer).decls}
        for d in decls.values():
            c.write_static(d.name, bo_key=layer_key(layer),
                           **{a: w.writer(a, layer) for a in d.names(Role.STATIC)})
    head = eng.plans[HEAD_PLAN].steps[0].decl
    c.write_static(head.name, bo_key=head.name, **{a: w.writer(a, None) for a in head.names(Role.STATIC)})
    write_vocab(c, w, head)     # the LM-head partitions: windows of one state (the token modules' embedding)
    eng.states.ensure(min(max(eng.buckets), eng.context))
    from .models.lowering import scratch_states
    for name, rows in scratch_states(c.decls.values()).items():   # q4 prefill: one buffer for all layers
        c.define_state(name, rows, per_key=False)
    if eng.token_decode is not None:
        eng.token_decode.preload(eng._embed)
    c.reset_counters()  # the profile counts inference traffic, not the one-time upload


def warm_up(eng) -> None:
    """One untimed prefill (smallest bucket) + decode step + LM head; then a clean state."""
    eng.prefill([eng.pad_id])
    eng.decode_step(eng.pad_id)
    if eng.token_decode is not None:
        eng.decode_next(eng.pad_id)
    eng.reset()
    eng.host_attn_s = 0.0
    eng.cache.reset_counters()
