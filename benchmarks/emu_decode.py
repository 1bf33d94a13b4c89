"""`make bench`: the embedded model on emu with bf16 weights and with its own GGUF in 4 bits (`WEIGHTS=q4`), timed in
one run so the two figures compare: the same 30-token prompt and the same number of generated tokens (the end-of-turn
token does not stop a timed run), both engines loaded and warmed up first, the runs interleaved (bf16, q4, q4, bf16,
...) so load on the machine falls on both alike, medians over the repetitions."""
from __future__ import annotations

import statistics
from contextlib import contextmanager

PROMPT_WORDS = ("The quick brown fox jumps over the lazy dog while the curious cat watches from the warm "
                "sunny window and thinks about dinner tonight").split()


def prompt_ids(tokenizer, n: int = 30) -> list[int]:
    """An n-token prompt, measured in tokens of this model's tokenizer."""
    ids = tokenizer.encode(" ".join(PROMPT_WORDS), add_special_tokens=False)
    return (ids * (n // max(1, len(ids)) + 1))[:n]


@contextmanager
def no_end_of_turn(eng):
    """Generate exactly max_new_tokens: the engine's end-of-turn ids emptied for the block."""
    saved = eng.stop_ids
    eng.stop_ids = frozenset()
    try:
        yield
    finally:
        eng.stop_ids = saved


def interleaved(engines: dict, ids: list[int], n_tokens: int, reps: int) -> dict:
    """{label: [GenerationResult] * reps}: each engine warmed up, then `reps` rounds, the order alternating."""
    for eng in engines.values():
        eng.generate(ids, max_new_tokens=4)
        eng.reset()
    out = {label: [] for label in engines}
    labels = list(engines)
    for rep in range(reps):
        for label in labels if rep % 2 == 0 else labels[::-1]:
            eng = engines[label]
            eng.reset()
            with no_end_of_turn(eng):
                res = eng.generate(ids, max_new_tokens=n_tokens)
            if len(res.tokens) != n_tokens:
                raise RuntimeError(f"{label}: {len(res.tokens)} tokens generated, {n_tokens} asked")
            out[label].append(res)
    return out


def medians(results) -> dict:
    return {k: statistics.median(getattr(r, k) for r in results)
            for k in ("ttft_s", "prefill_tok_s", "decode_tok_s", "ms_per_token")}


def bench_embedded_decode(model: str | None, n_tokens: int, reps: int = 5):
    """Prints the bf16 and q4 figures of one run; returns (the bf16 engine, its median ms per decode token)."""
    from llama_npu.engine import Engine

    eng = Engine.load(model, device="emu", progress=False)
    q4 = Engine.load(model, device="emu", progress=False, weights_mode="q4")
    ids = prompt_ids(eng.tokenizer)
    runs = interleaved({"bf16": eng, "q4": q4}, ids, n_tokens, reps)
    b, q = medians(runs["bf16"]), medians(runs["q4"])
    print(f"[bench] embedded model on emu: TTFT ({len(ids)}-token prompt) {b['ttft_s'] * 1e3:.1f} ms, "
          f"prefill {b['prefill_tok_s']:.1f} tok/s, decode {b['decode_tok_s']:.1f} tok/s "
          f"({b['ms_per_token']:.1f} ms/token, {n_tokens} tokens; target >= 15 tok/s); q4 weights (its GGUF): "
          f"decode {q['decode_tok_s']:.1f} tok/s ({q['ms_per_token']:.1f} ms/token, q4/bf16 time "
          f"{q['ms_per_token'] / b['ms_per_token']:.2f}), TTFT {q['ttft_s'] * 1e3:.1f} ms; medians of {reps} "
          f"interleaved runs each, the same prompt and tokens")
    del q4
    return eng, b["ms_per_token"]
