"""Chat turns reuse the KV cache: a prompt that extends the cached conversation feeds only its new tokens
(through decode), and gives the same next-token distribution as prefilling the whole history."""
from __future__ import annotations

import numpy as np
import pytest

from llama_npu.engine import DECODE_FEED_TOKENS, Engine


@pytest.fixture(scope="module")
def engine(tiny_model_dir, tmp_path_factory):
    return Engine.load(str(tiny_model_dir), device="emu", buckets=(16, 128), progress=False,
                       cache_dir=tmp_path_factory.mktemp("kc"))


def _prefill_calls(eng) -> int:
    return sum(r["calls"] for r in eng.cache.report() if r["module"].startswith("qkv_s"))


def test_extension_feeds_only_new_tokens_and_matches_full_prefill(engine):
    eng = engine
    eng.reset()
    first = [1, 7, 9, 11, 13]
    res = eng.generate(first, 4, reuse_kv=True)
    history = first + res.tokens[:-1]          # what the cache holds: the last sampled token was never fed
    assert eng.tokens == history
    turn2 = history + [res.tokens[-1], 20, 21, 22]
    assert eng.reusable_prefix(turn2)
    eng.cache.reset_counters()
    seen = []
    eng.generate(turn2, 1, reuse_kv=True, on_logits=lambda s, lg: seen.append(lg.copy()))
    assert _prefill_calls(eng) == 0, "the history must not be prefilled again"
    reused = seen[0]
    full = eng.prefill(turn2).logits           # the same prompt from scratch
    cos = float(reused @ full / (np.linalg.norm(reused) * np.linalg.norm(full)))
    assert cos >= 0.999, cos
    assert int(np.argmax(reused)) == int(np.argmax(full))


def test_diverging_prompt_falls_back_to_prefill(engine):
    eng = engine
    eng.reset()
    eng.generate([1, 7, 9], 2, reuse_kv=True)
    other = [1, 8, 9, 10, 11]                    # differs inside the cached prefix
    assert not eng.reusable_prefix(other)
    eng.cache.reset_counters()
    eng.generate(other, 1, reuse_kv=True)
    assert _prefill_calls(eng) == eng.shapes.n_layers
    assert eng.tokens[:len(other)] == other


def test_any_extension_reuses_the_cache_long_ones_as_prefill_chunks(engine):
    """A turn extending the cached conversation computes only its new tokens: a handful through decode, more
    as prefill chunks on top of the cache (never token by token), however long the history."""
    eng = engine
    big = max(eng.buckets)
    eng.reset()
    eng.generate([1, 7], 1, reuse_kv=True)
    base = list(eng.tokens)
    long_turn = base + list(range(20, 21 + DECODE_FEED_TOKENS + 10))
    assert eng.reusable_prefix(long_turn)
    eng.cache.reset_counters()
    res = eng.generate(long_turn, 1, reuse_kv=True)
    assert res.prompt_computed == len(long_turn) - len(base)
    calls = {r["module"]: r["calls"] for r in eng.cache.report()}
    assert sum(c for m, c in calls.items() if m.startswith("qkv_s")) == eng.shapes.n_layers   # one chunk
    # a conversation already past the largest bucket keeps extending its cache
    eng.reset()
    eng.generate([1] + [20 + i % 200 for i in range(big + 4)], 1, reuse_kv=True)
    turn = list(eng.tokens) + [30, 31, 32]
    assert len(eng.tokens) > big and eng.reusable_prefix(turn)


def test_prompt_longer_than_every_bucket_runs_and_matches_a_bigger_bucket(engine, tiny_model_dir, tmp_path):
    """Beyond the largest bucket the prompt runs as chunks over the cache prefix: same next token, logits
    within bf16 noise of prefilling it whole in a bucket that fits."""
    small = Engine.load(str(tiny_model_dir), device="emu", buckets=(16,), progress=False, cache_dir=tmp_path)
    prompt = [1] + [20 + (7 * i) % 200 for i in range(39)]
    seen_small, seen_big = [], []
    res = small.generate(prompt, 2, on_logits=lambda s, lg: seen_small.append(lg.copy()))
    assert res.prompt_len == 40 and small.pos == 41
    engine.reset()
    engine.generate(prompt, 2, on_logits=lambda s, lg: seen_big.append(lg.copy()))
    a, b = seen_small[0], seen_big[0]
    assert float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b))) >= 0.999
    assert int(np.argmax(a)) == int(np.argmax(b))
