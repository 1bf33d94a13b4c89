"""Chunked prefill (prompts and chat turns of any length up to the context, run as bucket-sized chunks on top
of the device KV cache) and the two decode paths (the whole layer on the device vs CPU attention), on emu with
a small checkpoint."""
from __future__ import annotations

import numpy as np
import pytest

from checkpoints import write_numpy_checkpoint
from llama_npu.engine import Engine
from llama_npu.errors import PromptError

BUCKETS = (16, 64)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return write_numpy_checkpoint(tmp_path_factory.mktemp("chunk") / "model", n_layers=2, max_position=512, seed=21)


@pytest.fixture(scope="module")
def engines(model_dir, tmp_path_factory):
    cache = tmp_path_factory.mktemp("kernels")
    npu = Engine.load(str(model_dir), device="emu", buckets=BUCKETS, cache_dir=cache, progress=False)
    host = Engine.load(str(model_dir), device="emu", buckets=BUCKETS, cache_dir=cache, progress=False,
                       decode_attention="host")
    return npu, host


def _ids(n: int, seed: int = 0) -> list[int]:
    rng = np.random.default_rng(seed)
    return [1] + rng.integers(3, 500, size=n - 1).tolist()


def _cos(a, b) -> float:
    a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


@pytest.mark.parametrize("total,start,want", [
    (10, 0, [(0, 16)]),                          # shorter than its bucket: the only padded case
    (64, 0, [(0, 64)]),
    (100, 0, [(0, 64), (36, 64)]),               # the last chunk ends at the prompt's end (overlap recomputed)
    (130, 0, [(0, 64), (64, 64), (114, 16)]),
    (40, 0, [(0, 64)]),                          # 64 <= 2 x 40: one chunk rather than 16 + 16 + 16
    (130, 120, [(114, 16)]),                     # a chat turn of 10 tokens on a 120-token history
    (200, 120, [(120, 64), (184, 16)]),
])
def test_chunk_plan(engines, total, start, want):
    assert engines[0].chunks(total, start) == want


def test_chunked_prefill_matches_one_pass(engines):
    """A 150-token prompt in 64-row chunks (attention over the cache prefix) vs its first 64 tokens prefilled
    and the rest fed one by one through decode: the same logits and hidden states within bf16 rounding (GEMM
    and GEMV sum in different orders), the same next token."""
    eng = engines[0]
    ids = _ids(150, seed=1)
    chunked = eng.prefill(ids, return_hidden=True)
    assert [h.shape[0] for h in chunked.hidden] == [150, 150] and chunked.prompt_len == 150
    one = eng.prefill(ids[:64], return_hidden=True)
    for t in ids[64:]:
        logits = eng.decode_step(t)
    assert _cos(chunked.logits, logits) > 0.9999
    assert int(np.argmax(chunked.logits)) == int(np.argmax(logits))
    for a, b in zip(chunked.hidden, one.hidden):
        assert _cos(a[:64], b) > 0.9999


def test_decode_paths_agree_bit_for_bit_and_dispatch_counts(engines):
    """Decode with attention on the device (one module per layer) and on the host (CPU attention between two
    modules) use the same attention numerics: identical logits; the device path is n_layers + 1 dispatches per
    token and writes only the embedding row and the position."""
    npu, host = engines
    ids = _ids(40, seed=2)
    steps = {}
    for eng in (npu, host):
        eng.prefill(ids)
        eng.cache.reset_counters()
        steps[eng.decode_attention] = [eng.decode_step(7 + i) for i in range(4)]
    for a, b in zip(steps["npu"], steps["host"]):
        np.testing.assert_array_equal(a, b)
    rows = npu.cache.report()
    n_layers, hidden = npu.shapes.n_layers, npu.shapes.hidden
    assert sum(r["calls"] for r in rows) == 4 * (n_layers + 1)
    written = sum(r["bytes_written"] for r in rows)
    assert written == 4 * (hidden * 2 + 4)       # the embedding row + the position scalar, per token
    head = next(r for r in rows if r["module"] == "lm_head")
    assert sum(r["bytes_read"] for r in rows) == head["bytes_read"]     # only the logits come back
    host_rows = host.cache.report()
    assert sum(r["calls"] for r in host_rows if not r["module"].startswith("state:")) == 4 * (2 * n_layers + 1)


def test_chat_turn_prefills_only_its_tokens(engines):
    eng = engines[0]
    history = _ids(120, seed=3)
    eng.generate(history, 2, reuse_kv=True)
    turn = eng.tokens + [5, 6, 7, 8, 9, 10, 11, 12, 13, 14]
    eng.cache.reset_counters()
    res = eng.generate(turn, 1, reuse_kv=True)
    assert res.prompt_computed == 10
    calls = {r["module"]: r["calls"] for r in eng.cache.report()}
    assert calls.get("qkv_s16") == eng.shapes.n_layers and "qkv_s64" not in calls     # one 16-row chunk
    reused = res.tokens[0]
    eng.reset()
    assert eng.generate(turn, 1).tokens[0] == reused


def test_context_limits_are_clear(engines, model_dir, tmp_path):
    eng = engines[0]
    with pytest.raises(PromptError, match="exceeds the model's context of 512"):
        eng.generate(_ids(500), 20)
    small = Engine.load(str(model_dir), device="emu", buckets=BUCKETS, cache_dir=tmp_path, progress=False,
                        context=100)
    assert small.context == 100 and max(small.windows) == 128      # windows are multiples of 64
    with pytest.raises(PromptError, match="this run's --context of 100"):
        small.generate(_ids(90), 20)
    assert len(small.generate(_ids(90), 5).tokens) >= 1
