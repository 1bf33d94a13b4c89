"""Engine.generate_step: the generation loop as a generator of (token, logprobs) with logits processors
(tiny 1-layer checkpoint on emu)."""
from __future__ import annotations

import threading

import numpy as np
import pytest

from llama_npu.engine import Engine, StepInfo


@pytest.fixture(scope="module")
def engine(tiny_model_dir, tmp_path_factory):
    return Engine.load(str(tiny_model_dir), device="emu", buckets=(16,), progress=False,
                       cache_dir=tmp_path_factory.mktemp("kc"))


PROMPT = [1, 7, 9, 11, 13]


def test_generate_is_generate_step(engine):
    engine.reset()
    res = engine.generate(PROMPT, 6)
    engine.reset()
    info = StepInfo()
    steps = list(engine.generate_step(PROMPT, 6, info=info))
    assert [t for t, _ in steps] == res.tokens and all(lp is None for _, lp in steps)
    assert (info.stop_reason, info.prompt_len, info.prompt_computed) == (res.stop_reason, 5, 5)


def test_processors_shape_the_logits_and_logprobs_are_their_log_softmax(engine):
    raw: list[np.ndarray] = []
    banned: list[int] = []

    def ban_greedy(tokens, logits):  # forbids what greedy would pick
        t = int(np.argmax(logits))
        banned.append(t)
        return np.where(np.arange(logits.size) == t, np.float32(-np.inf), logits)

    engine.reset()
    steps = list(engine.generate_step(PROMPT, 4, processors=[ban_greedy], logprobs=True,
                                      on_logits=lambda _s, lg: raw.append(lg.copy())))
    for (tok, lp), logits, b in zip(steps, raw, banned):
        assert tok != b and lp[b] == -np.inf
        z = np.where(np.arange(logits.size) == b, -np.inf, logits.astype(np.float64))
        ref = z - (np.max(z) + np.log(np.sum(np.exp(z - np.max(z)))))
        finite = np.isfinite(ref)
        assert np.allclose(lp[finite], ref[finite], atol=1e-5)
        assert tok == int(np.argmax(lp))  # greedy over the processed logits


def test_a_consumer_can_stop_after_any_yield(engine):
    engine.reset()
    stop = threading.Event()
    info = StepInfo()
    got = []
    for tok, _ in engine.generate_step(PROMPT, 10, stop_event=stop, info=info):
        got.append(tok)
        stop.set()
    assert len(got) == 1 and info.stop_reason in ("interrupted", "eos")
