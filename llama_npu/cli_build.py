"""The build-side verbs of `llama-npu`: compile, check-lowering, hw-check, prepare-model (the parser and the
run-side verbs are llama_npu.cli)."""
from __future__ import annotations

import sys
from pathlib import Path

from .cli_args import check_device
from .errors import UsageError


def cmd_compile(args) -> int:
    from multi_launch_builder.compile import build_modules
    from kernel_builder.toolchain import resolve_device_kind

    from .config import load_config, select_buckets
    from .embedded import cache_root
    from .model_source import resolve_model
    from .models import model_for

    check_device(args.device)
    kind = resolve_device_kind(args.device, compile_only=True)   # DEVICE=npu compiles without an NPU
    cfg = load_config(resolve_model(args.model, progress=not args.no_progress))
    from .memory import choose_context
    from .sizes import check_run_sizes, plan_modules

    args.buckets = check_run_sizes(cfg, args.buckets, args.context)

    kv = getattr(args, "kv", "bf16")
    ctx = choose_context(cfg, select_buckets(args.buckets, cfg.max_position), args.context, kv=kv)  # the build
    buckets = select_buckets(args.buckets, ctx)                                      # machine's memory is not the run's
    decls = plan_modules(model_for(cfg, getattr(args, "weights", "bf16"), kv), cfg, buckets, ctx, args.decode_attention)
    if args.only:
        unknown = sorted(set(args.only) - {d.name for d in decls})
        if unknown:
            raise UsageError(f"--only names unknown modules {unknown}; this model has "
                             f"{', '.join(d.name for d in decls)}")
        decls = [d for d in decls if d.name in args.only]
    print(f"model {cfg.model_dir}: {cfg.shapes}, buckets {list(buckets)}", file=sys.stderr)
    report = build_modules(decls, Path(args.cache_dir) if args.cache_dir else cache_root() / "kernels", kind,
                           progress=not args.no_progress, force=args.force, check=not args.no_check,
                           raise_on_error=False, hw_check=not args.no_hw_check)
    print(report.table())
    return 0 if report.ok else 1


def cmd_hw_check(args) -> int:
    from kernel_builder.hw import hw_check_main

    return hw_check_main(list(args.files) + (["--max-mib", str(args.max_mib)] if args.max_mib else []))


def cmd_prepare_model(args) -> int:
    from .config import load_config
    from .model_source import resolve_model

    from .sizes import check_model_sizes
    from .tokenizer import Tokenizer
    from .weights import ModelWeights

    model_dir = resolve_model(args.model, progress=not args.no_progress)
    cfg = load_config(model_dir)
    check_model_sizes(cfg)
    Tokenizer(model_dir)
    ModelWeights(cfg)   # as `run`: every safetensors header against its file size and the config's shapes
    print(f"model ready: {model_dir} ({cfg.shapes.n_layers} layers, hidden {cfg.shapes.hidden})")
    return 0


def cmd_check_lowering(args) -> int:
    from .check_lowering import check_lowering_main
    from .engine import DEFAULT_BUCKETS

    if args.buckets is None:
        args.buckets = DEFAULT_BUCKETS
    return check_lowering_main(args)
