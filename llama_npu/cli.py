"""`llama-npu run | chat | serve | compile | check-lowering | profile | doctor | hw-check` (also `python -m llama_npu`).

Bad input never prints a traceback: one line on stderr and exit code 2. The build-side verbs (compile,
check-lowering, hw-check, prepare-model) are llama_npu.cli_build; the argument types llama_npu.cli_args.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import threading

from .cli_args import (DEVICES, EXIT_BAD_INPUT, OneLineParser, _Parser, bucket_list, check_device,  # noqa: F401
                       non_negative_float, non_negative_int, port_number, positive_float, positive_int, probability,
                       seed_int)
from .cli_build import cmd_check_lowering, cmd_compile, cmd_hw_check, cmd_prepare_model
from .errors import LlamaNpuError, PromptError, UsageError

EXIT_INTERRUPTED = 130
PROMPT_ENV = "LLAMA_NPU_PROMPT"    # `make run PROMPT=...` passes the prompt here, never through a shell line
PROFILE_PROMPT = "What is the capital of France?"


def _common(p: argparse.ArgumentParser, sampling: bool = True) -> None:
    from .engine import DEFAULT_BUCKETS

    p.add_argument("--model", default=None,
                   help="HF model directory or a model id in the local HF cache (default: embedded SmolLM2-135M)")
    p.add_argument("--device", default=None, help="auto | npu | emu | null (default: $DEVICE or auto)")
    p.add_argument("--buckets", type=bucket_list, default=None,
                   help=f"prefill lengths to compile, multiples of 16 up to the context (default "
                        f"{','.join(map(str, DEFAULT_BUCKETS))}, filtered to the context)")
    p.add_argument("--cache-dir", default=None, help="kernel cache directory (default: $LLAMA_NPU_CACHE/kernels)")
    p.add_argument("--context", type=positive_int, default=None,
                   help="positions the KV cache may hold (default: the model's context, at most 32768, less "
                        "when memory is short)")
    p.add_argument("--decode-attention", choices=("npu", "host"), default="npu",
                   help="decode attention on the device (default: the whole layer is one dispatch) or on the "
                        "host CPU (fallback: two dispatches per layer, K/V rows mirrored to the host)")
    p.add_argument("--weights", choices=("bf16", "q4", "bfp16"), default="bf16",
                   help="q4: every linear layer in 4 bits on the device (a GGUF's Q4_0/Q4_1 blocks as they are, "
                        "its Q8_0 vocabulary in 8 bits, an AWQ/GPTQ checkpoint's int4 tensors, else round-to-nearest "
                        "per group of 32 at load; docs/quantization.md); bfp16: every linear layer at rest in block "
                        "float, 9 bits a weight, rounded once at load (the LM head stays bf16)")
    p.add_argument("--kv", choices=("bf16", "int8"), default="bf16",
                   help="the KV cache's format: int8 = codes with a power-of-two scale per position and kv head, "
                        "half the bytes decode attention reads (docs/quantization.md, \"KV cache\")")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    if sampling:
        p.add_argument("-n", "--n-tokens", type=positive_int, default=64, help="max new tokens (default 64)")
        p.add_argument("--temperature", type=non_negative_float, default=0.0, help="0 = greedy (default)")
        p.add_argument("--top-k", type=non_negative_int, default=0, help="0 = off (default)")
        p.add_argument("--top-p", type=probability, default=1.0, help="1 = off (default)")
        p.add_argument("--seed", type=seed_int, default=None)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="llama-npu", description="Llama-family LLMs on the AMD NPU2 (or its emulator).")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)
    run = sub.add_parser("run", help="generate a reply to one prompt, streaming, with timings")
    run.add_argument("--prompt", "-p", default=None,
                     help=f"the prompt (default: ${PROMPT_ENV}; `make run PROMPT=...` passes it that way)")
    run.add_argument("--raw", action="store_true", help="no chat template; special-token text in the prompt "
                     "(e.g. <|im_start|>) becomes control tokens (otherwise it is encoded as plain text)")
    run.add_argument("--dry-run", action="store_true", help="check model, sizes and prompt, print the prompt as "
                     "received and its token count, then exit (nothing is built or loaded)")
    _common(run)
    chat = sub.add_parser("chat", help="multi-turn chat (/clear, /quit, Ctrl-C stops a reply, Ctrl-D exits)")
    _common(chat)
    serve = sub.add_parser("serve", help="OpenAI-compatible HTTP server (/v1/chat/completions, /v1/models, ...)")
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    serve.add_argument("--port", type=port_number, default=8000, help="default 8000; 0 = any free port")
    serve.add_argument("--max-tokens", type=positive_int, default=1024,
                       help="max_tokens of requests that set none (capped at the context; default 1024)")
    serve.add_argument("--temperature", type=non_negative_float, default=1.0,
                       help="temperature of requests that set none (default 1.0, as the OpenAI API)")
    serve.add_argument("--max-body-mb", type=positive_float, default=4.0,
                       help="largest request body in MB; larger ones get 413 (default 4)")
    _common(serve, sampling=False)
    comp = sub.add_parser("compile", help="build every kernel module of a model into the cache")
    _common(comp, sampling=False)
    comp.add_argument("--force", action="store_true", help="rebuild even up-to-date modules")
    comp.add_argument("--no-check", action="store_true", help="skip the mlir-opt-22 check of the stitched text "
                      "(emu/null)")
    comp.add_argument("--only", action="append", default=[], metavar="MODULE",
                      help="build only this module (repeatable)")
    comp.add_argument("--no-hw-check", action="store_true",
                      help="compile modules over an NPU2 limit anyway (DEVICE=npu; docs/hardware-model.md)")
    low = sub.add_parser("check-lowering", help="lower every stitched module of a model with the real toolchain "
                                                "up to the NPU instructions; a table (exit 1 if one fails)")
    low.add_argument("--model", default=None, help="HF model directory (config.json is enough) or model id")
    low.add_argument("--buckets", type=bucket_list, default=None, help="prefill lengths (default 64,256,1024,2048)")
    low.add_argument("--context", type=positive_int, default=None, help="KV-cache positions (default: as compile)")
    low.add_argument("--no-progress", action="store_true", help="no progress bar")
    low.add_argument("--only", action="append", default=[], metavar="MODULE", help="only this module (repeatable)")
    low.add_argument("--weights", choices=("bf16", "q4", "bfp16"), default="bf16", help="q4: the 4-bit modules; bfp16: the block-float modules")
    low.add_argument("--kv", choices=("bf16", "int8"), default="bf16", help="int8: the KV8 cache's modules")
    low.add_argument("--full-depth", action="store_true", help="lower the one-dispatch decode token modules at the "
                     "model's full depth (default: the model cut to its first 2 layers; hours at full depth)")
    low.add_argument("--no-memo", action="store_true", help="lower every module again, even one whose text this "
                     "lowerer has judged before (verdicts are kept under $LLAMA_NPU_CACHE/lowering)")
    low.add_argument("--tool", default=None, help="a lowering tool with the $LLAMA_NPU_AIR_LOWER interface "
                     "(default: the installed aircc/aiecc, else $LLAMA_NPU_AIR_LOWER)")
    hw = sub.add_parser("hw-check", help="check AIR module files against the NPU2 hardware model")
    hw.add_argument("files", nargs="+", help="module .mlir files (exit 1 when one exceeds a limit)")
    hw.add_argument("--max-mib", type=positive_float, default=None,
                    help="refuse files larger than this many MiB (default 64)")
    prep = sub.add_parser("prepare-model", help="resolve the model (convert the embedded one once) and check it")
    prep.add_argument("--model", default=None)
    prep.add_argument("--no-progress", action="store_true")
    prof = sub.add_parser("profile", help="run a prompt and print per-module device time and bytes")
    prof.add_argument("--prompt", "-p", default=None,
                      help=f"the prompt (default: ${PROMPT_ENV}, else {PROFILE_PROMPT!r})")
    prof.add_argument("--raw", action="store_true", help="as for run")
    _common(prof)
    doc = sub.add_parser("doctor", help="check every piece of an NPU setup; a fix for each problem (exit 1 if "
                                        "the NPU path cannot work)")
    doc.add_argument("--model", default=None,
                     help="model whose memory needs are checked (default: embedded SmolLM2-135M)")
    doc.add_argument("--buckets", type=bucket_list, default=None,
                     help="prefill lengths the memory figure assumes (default 64,256,1024,2048)")
    doc.add_argument("--context", type=positive_int, default=None,
                     help="KV-cache positions the memory figure assumes (default: the model's context)")
    doc.add_argument("--weights", choices=("bf16", "q4", "bfp16"), default="bf16",
                     help="weight format the memory figure assumes (q4: 4-bit rows + the prefill scratch; "
                          "bfp16: 9 bits a weight)")
    doc.add_argument("--cache-dir", default=None, help="kernel cache directory (default: $LLAMA_NPU_CACHE/kernels)")
    doc.add_argument("--json", action="store_true", help="one JSON document instead of lines")
    doc.add_argument("--timeout", type=positive_float, default=10.0,
                     help="seconds each probed command may take (default 10)")
    return p


# ----------------------------------------------------------------------------------------------- helpers
def _prompt_arg(args, default: str | None = None) -> str:
    """--prompt, else $LLAMA_NPU_PROMPT (how `make run PROMPT=...` passes it: no shell line ever holds the
    text), else `default`."""
    prompt = args.prompt if args.prompt is not None else os.environ.get(PROMPT_ENV, default)
    if prompt is None:
        raise UsageError(f"no prompt: pass --prompt TEXT (or set ${PROMPT_ENV}; make run PROMPT=...)")
    return prompt


def _prepare(args, prompt: str | None):
    """Cheap checks before any kernel is built or weight read: device name, model, config, every size the
    kernels constrain (llama_npu.sizes), tokenizer, prompt budget. Returns (model_dir, token ids or None);
    args.buckets becomes the run's bucket list."""
    from .config import load_config
    from .engine import check_budget
    from .model_source import resolve_model
    from .sizes import check_run_sizes
    from .tokenizer import Tokenizer

    check_device(getattr(args, "device", None))
    model_dir = resolve_model(args.model, progress=not args.no_progress)
    cfg = load_config(model_dir)
    args.buckets = check_run_sizes(cfg, args.buckets, args.context)
    tok = Tokenizer(model_dir)
    ids = None
    if prompt is None:  # chat: the conversation goes through the chat template
        if not tok.has_chat_template:
            raise PromptError(f"{model_dir}: the tokenizer has no chat template; use `llama-npu run --raw`")
    else:
        if not prompt.strip():
            raise PromptError("empty prompt: pass some text with --prompt / PROMPT=...")
        if args.raw or not tok.has_chat_template:  # --raw: special-token text is parsed (the opt-in)
            ids = tok.encode(prompt, add_special_tokens=True, parse_special=args.raw)
        else:                                      # special-token text in the prompt stays text
            ids = tok.apply_chat_template([{"role": "user", "content": prompt}])
        ctx = args.context or cfg.max_position
        check_budget(len(ids), args.n_tokens, ctx,
                     "the model's context" if ctx == cfg.max_position else "this run's --context")
    return model_dir, ids


def _engine(args, model_dir):
    from .engine import Engine

    return Engine.load(str(model_dir), device=args.device or "auto", buckets=args.buckets,
                       cache_dir=args.cache_dir, progress=not args.no_progress, context=args.context,
                       decode_attention=args.decode_attention, weights_mode=args.weights, kv=args.kv)


def _sampler(args):
    from .sampling import Sampler

    return Sampler(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, seed=args.seed)


def _timings(res) -> str:
    return (f"TTFT {res.ttft_s * 1e3:.1f} ms ({res.prompt_len}-token prompt) | "
            f"prefill {res.prefill_tok_s:.1f} tok/s | decode {res.decode_tok_s:.1f} tok/s | "
            f"{res.ms_per_token:.1f} ms/token | {len(res.tokens)} tokens, stop: {res.stop_reason}")


@contextlib.contextmanager
def _ctrl_c_stops_reply():
    """Yields a threading.Event that the first Ctrl-C sets (generate() stops after the current token and
    the timings still print); a second Ctrl-C (e.g. during a long prefill) raises KeyboardInterrupt."""
    stop = threading.Event()

    def handler(_signum, _frame):
        if stop.is_set():
            raise KeyboardInterrupt
        stop.set()

    previous = signal.signal(signal.SIGINT, handler)
    try:
        yield stop
    finally:
        signal.signal(signal.SIGINT, previous)


def _print_delta(_tok: int, delta: str) -> None:
    sys.stdout.write(delta)
    sys.stdout.flush()


# ----------------------------------------------------------------------------------------------- commands
def cmd_run(args) -> int:
    model_dir, ids = _prepare(args, _prompt_arg(args))
    if args.dry_run:  # the prompt exactly as received (JSON-quoted), its token count, what would run
        import json

        print(f"prompt ({len(ids)} tokens): {json.dumps(_prompt_arg(args), ensure_ascii=False)}")
        device = args.device or os.environ.get("DEVICE") or "auto"
        print(f"model {model_dir}, buckets {list(args.buckets)}, device {device}: not run (--dry-run)")
        return 0
    sampler = _sampler(args)
    eng = _engine(args, model_dir)
    with _ctrl_c_stops_reply() as stop:
        res = eng.generate(ids, args.n_tokens, sampler=sampler, on_token=_print_delta, stop_event=stop)
    print()
    print(_timings(res))
    return EXIT_INTERRUPTED if res.stop_reason == "interrupted" else 0


def cmd_chat(args) -> int:
    model_dir, _ = _prepare(args, None)
    sampler = _sampler(args)
    eng = _engine(args, model_dir)
    tok = eng.tokenizer
    if sys.stdin.isatty():
        try:
            import readline  # noqa: F401  (line editing and history for input())
        except ImportError:  # pragma: no cover - not on every platform
            pass
    print("chat: /clear forgets the conversation, /quit (or Ctrl-D) exits, Ctrl-C stops a reply", file=sys.stderr)
    history: list[dict] = []
    while True:
        try:
            line = input(">>> ")
        except EOFError:
            print()
            return 0
        except KeyboardInterrupt:
            print()
            continue
        text = line.strip()
        if not text:
            continue
        if text == "/quit":
            return 0
        if text == "/clear":
            history.clear()
            eng.reset()
            print("(conversation cleared)", file=sys.stderr)
            continue
        history.append({"role": "user", "content": text})
        ids = tok.apply_chat_template(history)
        try:
            eng.check_budget(len(ids), args.n_tokens)
        except PromptError as e:
            print(f"llama-npu: {e} (use /clear)", file=sys.stderr)
            history.pop()
            continue
        try:
            with _ctrl_c_stops_reply() as stop:
                # reuse_kv: the history already in the KV cache is not prefilled again, only the new turn
                res = eng.generate(ids, args.n_tokens, sampler=sampler, on_token=_print_delta, stop_event=stop,
                                   reuse_kv=True)
        except KeyboardInterrupt:  # second Ctrl-C: drop this turn, keep the conversation before it
            print("\n(reply interrupted)", file=sys.stderr)
            history.pop()
            continue
        print()
        print(_timings(res), file=sys.stderr)
        history.append({"role": "assistant", "content": res.text.strip()})


def cmd_serve(args) -> int:
    from . import server
    from .serve_limits import ServeLimits
    from .serve_worker import EngineWorker

    model_dir, _ = _prepare(args, None)  # device name, model, config, chat template: before any work
    try:
        sock = server.listen(args.host, args.port)  # a busy port fails now, not after loading
    except OSError as e:
        why = (e.strerror or str(e)).split(" (while attempting")[0]
        raise UsageError(f"cannot listen on {args.host}:{args.port}: {why}") from None
    try:
        eng = _engine(args, model_dir)
        worker = EngineWorker(eng, server.model_id(args.model, model_dir), args.max_tokens, args.temperature)
        print(f"llama-npu serve: {server.url_of(sock)}/v1 (model {worker.model_id}); Ctrl-C stops", flush=True)
        limits = ServeLimits(max_body_bytes=int(args.max_body_mb * (1 << 20)))
        server.run(worker, sock, limits)  # until Ctrl-C / SIGTERM (Ctrl-C while loading, or a second one: exit 130)
    finally:
        sock.close()
    print("llama-npu serve: stopped", file=sys.stderr)
    return 0


def cmd_profile(args) -> int:
    from . import profile

    model_dir, ids = _prepare(args, _prompt_arg(args, PROFILE_PROMPT))
    sampler = _sampler(args)
    res = profile.profile_main(_engine(args, model_dir), ids, args.n_tokens, sampler)
    print(_timings(res))
    return 0


def cmd_doctor(args) -> int:
    from .doctor import doctor_main
    from .engine import DEFAULT_BUCKETS

    if args.buckets is None:
        args.buckets = DEFAULT_BUCKETS
    return doctor_main(args)


COMMANDS = {"run": cmd_run, "prepare-model": cmd_prepare_model, "chat": cmd_chat, "serve": cmd_serve,
            "compile": cmd_compile, "check-lowering": cmd_check_lowering, "profile": cmd_profile, "doctor": cmd_doctor,
            "hw-check": cmd_hw_check}


def _one_line(e: BaseException) -> str:
    text = str(e).strip() or type(e).__name__
    return text.splitlines()[0]


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        from kernel_builder.toolchain import ToolchainMissing
    except ImportError:  # pragma: no cover - kernel_builder always ships with us
        ToolchainMissing = ()
    from multi_launch_builder.compile import BuildError
    from multi_launch_builder.devices.base import DeviceRunError

    try:
        return COMMANDS[args.command](args)
    except (LlamaNpuError, ToolchainMissing) as e:
        print(f"llama-npu: error: {_one_line(e)}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except (BuildError, DeviceRunError) as e:  # a module failed to build or to run: name it, no traceback
        print(f"llama-npu: error: {_one_line(e)}", file=sys.stderr)
        return 1
    except OSError as e:  # unusable cache dir, permission denied, disk full: the path says enough
        print(f"llama-npu: error: {_one_line(e)} (check LLAMA_NPU_CACHE / --cache-dir)", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(file=sys.stderr)
        return EXIT_INTERRUPTED


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
