"""`make bench`: long prompts and long chats (chunked prefill over the device KV cache) and decode at depth.

1. Embedded SmolLM2-135M on emu: TTFT of 1k, 2k, 4k and 8k-token prompts (one run; the 8k/2k ratio).
2. Embedded model on emu: a 10-turn chat whose history passes 3,000 tokens: per turn the new tokens, the history,
   the chunks, the TTFT on emu and the hardware model's time for the same chunks. A turn never re-runs the
   history: its GEMMs scale with its own chunks, its attention with (its rows x the history); at 135M that
   attention is most of the modeled NPU time late in the chat, while on emu the chunk shapes dominate.
3. Llama-3.2-1B shapes on the null device: dispatches and host<->device bytes of 1k/2k/4k/8k-token prefills,
   and decode at positions ~100 and ~4000 (dispatches, bytes and host time per token: flat in the position).
"""
from __future__ import annotations

import tempfile
import time
from pathlib import Path

PROMPT_LENGTHS = (1024, 2048, 4096, 8000)


def _text_ids(tokenizer, n: int) -> list[int]:
    """n token ids of real text (the repository's docs, repeated), BOS first."""
    root = Path(__file__).resolve().parents[1] / "docs"
    text = "\n\n".join(p.read_text() for p in sorted(root.glob("*.md")))
    ids = tokenizer.encode(text, add_special_tokens=False)
    while len(ids) < n:
        ids = ids + ids
    bos = tokenizer.token_to_id("<|im_start|>") or 1
    return [bos] + ids[: n - 1]


def bench_long_prompts(model: str | None = None, lengths=PROMPT_LENGTHS, engine=None) -> dict:
    from llama_npu.engine import Engine

    eng = engine or Engine.load(model, device="emu", progress=False)
    out = {}
    for n in lengths:
        if n + 1 > eng.context:
            continue
        ids = _text_ids(eng.tokenizer, n)
        eng.reset()
        res = eng.generate(ids, 1)
        out[n] = res.ttft_s
        chunks = eng.chunks(n, 0)
        print(f"[bench] embedded model on emu: TTFT {n}-token prompt {res.ttft_s:.1f} s "
              f"({len(chunks)} chunk{'s' * (len(chunks) > 1)}: {', '.join(str(r) for _, r in chunks)} rows)")
    if 2048 in out and 8000 in out:
        print(f"[bench]   8k/2k TTFT ratio {out[8000] / out[2048]:.1f} (target <= 8)")
    return out


def bench_long_chat(model: str | None = None, turns: int = 10, words_per_turn: int = 260,
                    engine=None) -> list[dict]:
    from benchmarks.hw_model import modeled_chunks
    from kernel_builder.hw import analyze_module
    from multi_launch_builder.stitcher import stitch
    from llama_npu.engine import Engine

    eng = engine or Engine.load(model, device="emu", progress=False)
    eng.reset()
    head_s = analyze_module(stitch(eng.model.head().decls[0]), "lm_head").modeled_s
    root = Path(__file__).resolve().parents[1] / "docs"
    words = " ".join(p.read_text() for p in sorted(root.glob("*.md"))).split()
    history: list[dict] = []
    rows = []
    for t in range(turns):
        chunk = " ".join(words[t * words_per_turn:(t + 1) * words_per_turn])
        history.append({"role": "user", "content": f"Note {t + 1}: {chunk}\nReply with OK."})
        ids = eng.tokenizer.apply_chat_template(history)
        before = eng.pos
        res = eng.generate(ids, 4, reuse_kv=True)
        chunks = eng.chunks(len(ids), len(ids) - res.prompt_computed)
        rows.append({"turn": t + 1, "history": before, "new": res.prompt_computed, "ttft_s": res.ttft_s,
                     "chunks": chunks, "npu_s": modeled_chunks(eng.model, chunks, eng.windows) + head_s})
        history.append({"role": "assistant", "content": res.text.strip()})
    print(f"[bench] embedded model on emu, {turns}-turn chat (the cache is reused; only each turn's tokens run; "
          f"'NPU' = the hardware model's time for the same chunks, attention costed at their positions):")
    for r in rows:
        print(f"[bench]   turn {r['turn']:2d}: history {r['history']:5d} tokens, new {r['new']:4d} tokens "
              f"(chunks {', '.join(f'{n}@{p}' for p, n in r['chunks'])}), TTFT emu {r['ttft_s']:.2f} s, "
              f"NPU modeled {r['npu_s'] * 1e3:.1f} ms")
    return rows


def bench_null_long(n_tokens: int = 6, lengths=PROMPT_LENGTHS, depths=(100, 4000), context: int = 16384) -> dict:
    """Llama-3.2-1B shapes on the null device (sparse checkpoint: no weights on disk, no compute)."""
    from benchmarks.null_device import _kb, _mb, _totals, write_sparse_checkpoint
    from llama_npu.engine import Engine
    from llama_npu.model_source import resolve_model
    from llama_npu.models.llama import LLAMA32_1B

    tok_dir = resolve_model(None, progress=False)
    res = {}
    with tempfile.TemporaryDirectory(prefix="llama32-1b-long-") as tmp:
        model_dir = write_sparse_checkpoint(Path(tmp) / "model", LLAMA32_1B, tok_dir, tied=True)
        eng = Engine.load(str(model_dir), device="null", cache_dir=Path(tmp) / "kernels", progress=False,
                          warmup=False, context=context)
        cache = eng.cache
        for n in lengths:
            ids = list(range(3, 3 + n))
            eng.prefill(ids)                     # the first call of each module writes nothing new: weights are
            cache.reset_counters()               # resident; count a steady pass
            eng.prefill(ids)
            t = _totals(cache)
            res[n] = t
            print(f"[bench] Llama-3.2-1B shapes on null: {n}-token prefill: {t['calls']} dispatches "
                  f"({len(eng.chunks(n, 0))} chunks), {_mb(t['w'])} written + {_mb(t['r'])} read host<->device")
        for depth in depths:
            eng.prefill(list(range(3, 3 + depth)))
            cache.reset_counters()
            t0 = time.perf_counter()
            for i in range(n_tokens):
                eng.decode_step(5 + i)
            host_ms = 1e3 * (time.perf_counter() - t0) / n_tokens
            t = _totals(cache)
            res[f"decode@{depth}"] = {**t, "host_ms": host_ms}
            print(f"[bench] Llama-3.2-1B shapes on null: decode at position ~{depth}: "
                  f"{t['calls'] / n_tokens:.0f} dispatches/token, {_kb(t['w'] / n_tokens)} written + "
                  f"{_kb(t['r'] / n_tokens)} read per token, host {host_ms:.2f} ms/token")
    return res
