"""`llama-npu check-lowering` (`make check-lowering`): every stitched module of a model through the real lowering
up to the NPU instructions (multi_launch_builder.compile.lowering), one table row per module; exit 1 when one
does not lower, 2 when there is nothing to lower with.

The modules are the ones `llama-npu compile` builds at these buckets and context, for both decode-attention
placements (the fused decode layer and the host-attention fallback), each with the aircc preset the build
derives from its kernels (recorded in the stitched header, which the lowering applies)."""
from __future__ import annotations

import sys

from kernel_builder.toolchain_pins import pin_text


def model_modules(model: str | None, buckets, context: int | None, only: list[str], progress: bool,
                  weights: str = "bf16", full_depth: bool = False, kv: str = "bf16"):
    """(config, [(name, stitched text, launch count)]) of every module of the model, or of `only` those (the
    token modules as `_token_decls` says)."""
    from multi_launch_builder.compile import generate, stitch_text

    from .config import load_config, select_buckets
    from .errors import UsageError
    from .memory import choose_context
    from .model_source import resolve_model
    from .models import model_for

    cfg = load_config(resolve_model(model, progress=progress))
    ctx = choose_context(cfg, select_buckets(buckets, cfg.max_position), context, weights=weights, kv=kv)
    bs = select_buckets(buckets, ctx)
    fam = model_for(cfg, weights, kv)   # q4: the 4-bit modules (a GGUF's 8-bit LM head: tests/test_air_lower_q4.py)
    decls: dict = {}
    for placement in ("npu", "host") if kv == "bf16" else ("npu",):   # the KV8 cache: NPU decode attention
        for d in fam.modules(bs, ctx, placement):
            decls.setdefault(d.name, d)
    decls.update(_token_decls(cfg, fam, ctx, weights, full_depth))
    if only:
        unknown = sorted(set(only) - set(decls))
        if unknown:
            raise UsageError(f"--only names unknown modules {unknown}; this model has {', '.join(decls)}")
        decls = {n: d for n, d in decls.items() if n in only}
    out = []
    for name, d in decls.items():
        text = stitch_text(generate(d))
        out.append((name, text, len(d.launches)))
    return cfg, bs, ctx, out


PROBE_LAYERS = 2


def _token_decls(cfg, fam, ctx: int, weights: str, full_depth: bool) -> dict:
    """The one-dispatch decode token's modules (llama_npu.token_decode), one per KV window. Such a module repeats
    the per-layer decode module's launches once per layer (SmolLM2: 467 launches), and the real lowering takes
    ~10-20 s per launch on 2 cores, so by default each is lowered as the same model cut to its first
    PROBE_LAYERS layers (same widths, vocabulary, windows and kernels; named `<module>@<n>L`); `--full-depth`
    lowers the modules the engine runs."""
    import dataclasses

    from .models import model_for
    from .token_decode import token_decls

    if full_depth or cfg.shapes.n_layers <= PROBE_LAYERS:
        return {d.name: d for d in token_decls(fam, fam.kv_windows(ctx))}
    cut = dataclasses.replace(cfg, shapes=dataclasses.replace(cfg.shapes, n_layers=PROBE_LAYERS))
    try:
        probe = model_for(cut, weights, fam.kv)
    except ValueError:   # a family whose per-layer pattern does not cut (e.g. Gemma 3's layer types): full depth
        return {d.name: d for d in token_decls(fam, fam.kv_windows(ctx))}
    out = {}
    for d in token_decls(probe, probe.kv_windows(ctx)):
        out[f"{d.name}@{PROBE_LAYERS}L"] = d      # (the row's name; the module text is the probe's own)
    return out


def check_lowering_main(args) -> int:
    from multi_launch_builder.compile.lowering import LoweringUnavailable, check_lowering, find_lowerer

    try:
        lowerer = find_lowerer(tool=args.tool)
    except LoweringUnavailable as e:
        print(f"llama-npu: {e}", file=sys.stderr)
        return 2
    cfg, bs, ctx, modules = model_modules(args.model, args.buckets, args.context, args.only,
                                          progress=not args.no_progress, weights=getattr(args, "weights", "bf16"),
                                          kv=getattr(args, "kv", "bf16"),
                                          full_depth=getattr(args, "full_depth", False))
    print(f"check-lowering: {cfg.model_dir.name} ({cfg.shapes.n_layers} layers, hidden {cfg.shapes.hidden}), "
          f"buckets {','.join(map(str, bs))}, context {ctx}, weights {getattr(args, 'weights', 'bf16')}: "
          f"{len(modules)} modules; pinned {pin_text()}; "
          f"lowering with {lowerer.describe()}", flush=True)
    memo = None
    if not args.no_memo:
        from external_kernels.paths import cache_root
        from multi_launch_builder.compile.lowering import VerdictMemo
        memo = VerdictMemo(cache_root() / "lowering")
    report = check_lowering(modules, lowerer, progress=not args.no_progress, memo=memo)
    print(report.table())
    return 0 if report.ok else 1
