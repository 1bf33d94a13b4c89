"""Chat turns reuse the KV cache: a prompt that extends the cached conversation feeds only its new tokens
(through decode), and gives the same next-token distribution as prefilling the whole history; a repeated or
edited prompt reuses the prefix it shares with the cache."""
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


def test_diverging_prompt_reuses_up_to_the_divergence(engine):
    eng = engine
    eng.reset()
    eng.generate([1, 7, 9], 2, reuse_kv=True)
    other = [1, 8, 9, 10, 11]                    # differs inside the cached prefix: only [1] is shared
    assert eng.reusable_prefix(other) == 1
    res = eng.generate(other, 1, reuse_kv=True)
    assert res.prompt_computed == 4 and eng.tokens[:len(other)] == other
    fresh = [2, 7, 9, 10, 11]                    # nothing shared: a prefill from position 0
    assert eng.reusable_prefix(fresh) == 0
    eng.cache.reset_counters()
    assert eng.generate(fresh, 1, reuse_kv=True).prompt_computed == 5
    assert _prefill_calls(eng) == eng.shapes.n_layers


def _first_logits(eng, ids, reuse):
    seen = []
    res = eng.generate(ids, 1, reuse_kv=reuse, on_logits=lambda s, lg: seen.append(lg.copy()))
    return res, seen[0]


@pytest.mark.parametrize("attention", ["npu", "host"])
def test_repeated_and_edited_prompts_reuse_all_they_share(engine, tiny_model_dir, tmp_path_factory, attention):
    """The identical prompt again computes only its last token; a prompt edited after a shared prefix (or
    shorter than the cached conversation) computes from the first difference. Each gives the logits of a
    prefill from scratch (stale rows past the shared prefix are never read)."""
    eng = engine if attention == "npu" else Engine.load(
        str(tiny_model_dir), device="emu", buckets=(16, 128), progress=False, decode_attention="host",
        cache_dir=tmp_path_factory.mktemp("kc_host"))
    prompt = [1] + [20 + (5 * i) % 150 for i in range(30)]
    edited = prompt[:12] + [200, 201, 202]
    shorter = prompt[:20]
    for ids, shared in ((prompt, len(prompt) - 1), (edited, 12), (shorter, len(shorter) - 1)):
        eng.reset()
        eng.generate(prompt, 6, reuse_kv=True)   # the cache: the prompt and 5 generated tokens
        assert eng.reusable_prefix(ids) == shared
        res, reused = _first_logits(eng, ids, reuse=True)
        assert res.prompt_computed == len(ids) - shared
        eng.reset()
        _, full = _first_logits(eng, ids, reuse=False)
        cos = float(reused @ full / (np.linalg.norm(reused) * np.linalg.norm(full)))
        assert cos >= 0.999 and int(np.argmax(reused)) == int(np.argmax(full)), (len(ids), shared, cos)


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
