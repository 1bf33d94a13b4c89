"""`python -m verify verify|diagnosis`: the top-k gate and the per-layer drift lens.

Exit codes: 0 pass (diagnosis: always, once it ran), 1 gate failure, 2 cannot run (missing torch /
transformers, a model the reference or our runtime cannot load, bad prompts or arguments).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from . import diagnosis as diag
from verify import gate_report as rep
from .gate import compare
from .hf_runner import (DEFAULT_SEED, DEFAULT_THREADS, HF_ATTN, HFReference, ReferenceUnavailable,
                        import_reference_stack)
from .prompt_set import PROMPTS_DIR, Prompt, load_prompts

EXIT_PASS, EXIT_FAIL, EXIT_UNAVAILABLE = 0, 1, 2


# The runtime CLI's argument types and one-line parser: the same rules and messages for both commands
# (its bad-input exit code, 2, is also verify's "cannot run").
from llama_npu.cli import OneLineParser, bucket_list as _buckets, positive_int as _positive  # noqa: E402


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="python -m verify", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True, parser_class=OneLineParser)

    def common(sp):
        sp.add_argument("--model", default=None, help="HF directory or id (default: embedded SmolLM2-135M-Instruct)")
        sp.add_argument("--device", default="auto", help="auto|npu|emu|null (default: auto)")
        sp.add_argument("--buckets", type=_buckets, default=None, help="prefill buckets, e.g. 64,256")
        sp.add_argument("--threads", type=_positive, default=DEFAULT_THREADS, help="torch threads for HF (fixed for determinism)")
        sp.add_argument("--seed", type=int, default=DEFAULT_SEED)
        sp.add_argument("--weights", choices=("bf16", "q4", "bfp16"), default="bf16",
                        help="our side's weights (q4: docs/quantization.md); HF runs the model directory, for a "
                             "GGUF the same blocks dequantized by transformers")
        sp.add_argument("--kv", choices=("bf16", "int8"), default="bf16",
                        help="our side's KV cache (int8: docs/quantization.md, \"KV cache\"); HF keeps bf16")

    v = sub.add_parser("verify", help="top-k token gate vs HF transformers bf16")
    common(v)
    v.add_argument("--full", action="store_true", help="run every prompt (default: the quick subset)")
    v.add_argument("--prompts-dir", type=Path, default=PROMPTS_DIR)
    v.add_argument("--n-tokens", type=_positive, default=32)
    v.add_argument("--top-k", type=_positive, default=5)
    v.add_argument("--report-dir", type=Path, default=Path("build/verify"))

    d = sub.add_parser("diagnosis", help="per-layer hidden-state drift vs HF (informational)")
    common(d)
    d.add_argument("--prompt", default=None, help="default: $LLAMA_NPU_PROMPT (how `make diagnosis PROMPT=...` "
                   "passes it), else the built-in prompt")
    d.add_argument("--chat", action="store_true", help="wrap the prompt in the chat template")
    d.add_argument("--json", type=Path, default=None, help="also write the per-layer table as JSON here")
    return p


def _decoder(tokenizer):
    """Decode keeping special tokens visible (an EOS in the table should read as EOS, not as '')."""
    def decode(ids):
        try:
            return tokenizer.decode(ids, skip_special_tokens=False)
        except TypeError:
            return tokenizer.decode(ids)
    return decode


def _load_our_runtime(args):
    from .npu_runner import OurRuntime

    return OurRuntime.load(model=args.model, device=args.device, buckets=args.buckets, progress=True,
                           weights=args.weights, kv=getattr(args, "kv", "bf16"))


def _check_ours_cheaply(args):
    """What our runtime would reject, checked from config.json and the safetensors headers only (no
    weight data, no kernels), so an unsupported or damaged model gets our one-line error instead of a
    transformers load report. Returns the resolved model directory."""
    import os

    from llama_npu.cli import check_device
    from llama_npu.config import load_config
    from llama_npu.model_source import resolve_model
    from llama_npu.weights import ModelWeights

    check_device(args.device)
    requested = args.device if args.device not in (None, "", "auto") else os.environ.get("DEVICE", "auto")
    if requested.lower() == "null":  # the null device only counts dispatches; its logits mean nothing
        raise ValueError("--device null computes no numbers, so there is nothing to compare; use emu or npu")
    if requested.lower() == "npu":
        from kernel_builder.toolchain import resolve_device_kind

        resolve_device_kind("npu")  # ToolchainMissing names every missing piece
    model_dir = resolve_model(args.model)
    ModelWeights(load_config(model_dir))
    return model_dir


def _load_both(args, runtime=None, reference=None):
    """Cheap checks first (torch present, our config + weight headers, then the HF reference load), so
    every "cannot run" case exits 2 before the expensive engine build + weight upload."""
    import_reference_stack()
    if reference is None:
        model_dir = runtime.model_dir if runtime is not None else _check_ours_cheaply(args)
        reference = HFReference.load(model_dir, threads=args.threads, seed=args.seed)
    runtime = runtime or _load_our_runtime(args)
    return runtime, reference


def _user_errors() -> tuple[type[BaseException], ...]:
    from kernel_builder.toolchain import ToolchainMissing
    from llama_npu.errors import LlamaNpuError

    return (ReferenceUnavailable, LlamaNpuError, ToolchainMissing, ValueError)


def run_verify(args, runtime=None, reference=None) -> int:
    prompts = load_prompts(args.prompts_dir, full=args.full)
    t0 = time.perf_counter()
    runtime, reference = _load_both(args, runtime, reference)
    print(f"[verify] model {runtime.model_dir} on {runtime.device_name}: {len(prompts)} prompt(s) x "
          f"{args.n_tokens} greedy tokens, top-{args.top_k} rule (loaded in {time.perf_counter() - t0:.1f}s)",
          flush=True)
    results = []
    for p in prompts:
        results.append(verify_prompt(p, runtime, reference, args.n_tokens, args.top_k))
    decode = _decoder(runtime.tokenizer)
    report = rep.VerifyReport(model=str(runtime.model_dir), device=runtime.device_name, n_tokens=args.n_tokens,
                              top_k=args.top_k, full=args.full, results=results,
                              settings=_settings(args))
    print(rep.console_table(report, decode))
    js, md = rep.write(report, args.report_dir, decode)
    print(f"[verify] report: {js} {md}")
    print(f"[verify] {'PASS' if report.passed else 'FAIL'} "
          f"({sum(r.verdict.passed for r in results)}/{len(results)} prompts)")
    return EXIT_PASS if report.passed else EXIT_FAIL


def verify_prompt(p: Prompt, runtime, reference, n_tokens: int, k: int) -> rep.PromptResult:
    ids = p.token_ids(runtime.tokenizer)  # OUR tokenizer's ids feed both sides
    t = time.perf_counter()
    ours = runtime.greedy(ids, n_tokens, k)
    t_ours = time.perf_counter() - t
    t = time.perf_counter()
    ref = reference.greedy(ids, n_tokens, k, eos_ids=runtime.eos_ids)
    t_ref = time.perf_counter() - t
    verdict = compare(ours, ref)
    print(f"[verify] {p.name}: {len(ids)} prompt tokens, ours {len(ours)} steps in {t_ours:.1f}s, "
          f"HF {len(ref)} steps in {t_ref:.1f}s -> {'PASS' if verdict.passed else 'FAIL'} ({verdict.reason})",
          flush=True)
    return rep.PromptResult(p.name, p.chat, ids, ours, ref, verdict)


def _settings(args) -> dict:
    torch, transformers = import_reference_stack()
    import numpy

    return {"torch_threads": args.threads, "seed": args.seed, "hf_dtype": "bfloat16", "hf_attn": HF_ATTN,
            "torch": torch.__version__, "transformers": transformers.__version__, "numpy": numpy.__version__}


def run_diagnosis(args, runtime=None, reference=None) -> int:
    runtime, reference = _load_both(args, runtime, reference)
    import os

    args.prompt = args.prompt or os.environ.get("LLAMA_NPU_PROMPT") or diag.DEFAULT_PROMPT
    prompt = Prompt("diagnosis", args.prompt, chat=args.chat)
    ids = prompt.token_ids(runtime.tokenizer)
    ours = runtime.layer_outputs(ids)
    ref_layers, _ = reference.layer_outputs(ids)
    stats = diag.layer_stats(ours, ref_layers)
    print(f"[diagnosis] {runtime.model_dir} on {runtime.device_name}: prefill of {len(ids)} tokens, "
          f"{len(stats)} layers (ours vs HF bf16 decoder-layer outputs)")
    print(diag.format_table(stats))
    worst = min(stats, key=lambda s: s.cos_min)
    print(f"[diagnosis] lowest cosine {worst.cos_min:.5f} at layer {worst.layer} (informational; never fails)")
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"prompt": args.prompt, "chat": args.chat, "prompt_ids": ids,
                                         "layers": [s.to_dict() for s in stats]}, indent=1) + "\n")
    return EXIT_PASS


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    tag = f"[{args.cmd}]"
    try:
        return run_verify(args) if args.cmd == "verify" else run_diagnosis(args)
    except _user_errors() as e:
        print(f"{tag} error: {(str(e).strip().splitlines() or [type(e).__name__])[0]}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    except KeyboardInterrupt:
        print(file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
