"""Part of `make bench`: the per-token cost of grammar-constrained decoding (llguidance) on the embedded
SmolLM2 tokenizer (vocabulary 49152), beside the emu decode step: for JSON schemas of growing size and the
forced tool-call grammar, each token's mask computation + its application to the logits (numpy) along a
valid answer, as `serve` runs it (llama_npu.constrained.Constraint). Goal: <= 10 % of a decode step.

    .venv/bin/python -m benchmarks.constrained [--decode-ms 50]
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np

from benchmarks.constraint_engines import SCHEMAS


def _cases():
    from llama_npu.tool_calls import GENERIC, ToolSpec, forced_grammar

    tools = [{"type": "function", "function": {"name": n, "parameters": s}}
             for n, (s, _) in (("make_pet", SCHEMAS["nested"]), ("draw", SCHEMAS["refs+anyOf"]))]
    call = {"name": "make_pet", "arguments": SCHEMAS["nested"][1]}
    for name, (schema, instance) in SCHEMAS.items():
        yield f"schema {name} ({len(json.dumps(schema))} B)", ("schema", schema), json.dumps(instance)
    lark = forced_grammar(GENERIC, ToolSpec(tools, "required"))
    yield f"forced tool call, 2 tools ({len(lark)} B grammar)", ("lark", lark), \
        "<tool_call>\n" + json.dumps(call) + "\n</tool_call>"


def bench_constrained(decode_ms: float | None = None) -> list[float]:
    from llama_npu.constrained import GrammarEngine
    from llama_npu.model_source import resolve_model
    from llama_npu.tokenizer import Tokenizer

    tok = Tokenizer(resolve_model(None, progress=False))
    stops = {tok.token_to_id("<|im_end|>"), tok.token_to_id("<|endoftext|>")}
    t0 = time.perf_counter()
    ge = GrammarEngine.for_tokenizer(tok, stops, tok.vocab_size)
    print(f"[bench] constrained decoding (llguidance): tokenizer setup {time.perf_counter() - t0:.2f} s once, "
          f"vocabulary {tok.vocab_size}")
    rng = np.random.default_rng(0)
    medians = []
    for label, (kind, grammar), text in _cases():
        t0 = time.perf_counter()
        c = ge.json_schema(grammar) if kind == "schema" else ge.lark(grammar)
        compile_ms = (time.perf_counter() - t0) * 1e3
        ids = tok.encode(text, add_special_tokens=False)
        logits = rng.standard_normal(tok.vocab_size).astype(np.float32)
        times = []
        for i in range(len(ids) + 1):
            t1 = time.perf_counter()
            out = c(ids[:i], logits)
            times.append(time.perf_counter() - t1)
            assert i == len(ids) or np.isfinite(out[ids[i]]), f"{label}: token {i} of a valid answer was masked"
        med, p90 = statistics.median(times) * 1e3, sorted(times)[int(0.9 * len(times))] * 1e3
        medians.append(med)
        mean = statistics.fmean(times) * 1e3
        share = f", mean {100 * mean / decode_ms:.1f} % of a {decode_ms:.1f} ms decode step" if decode_ms else ""
        print(f"[bench]   {label}: compile {compile_ms:.1f} ms; per token median {med:.3f} ms, mean {mean:.3f} ms, "
              f"p90 {p90:.3f} ms "
              f"over {len(ids)} tokens{share}")
    return medians


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.constrained")
    ap.add_argument("--decode-ms", type=float, default=None, help="a decode step's time, for the percentage")
    bench_constrained(ap.parse_args().decode_ms)


if __name__ == "__main__":
    main()
