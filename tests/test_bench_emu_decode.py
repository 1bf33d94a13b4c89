"""`make bench`'s bf16-vs-q4 emu decode comparison (benchmarks/emu_decode.py) measures both alike: every engine
warmed up before any timed run, the runs interleaved with the order alternating, each run from a reset engine on the
same prompt, exactly the asked number of tokens (an end-of-turn token does not end a timed run, and the engine's
stop ids come back afterwards), medians per engine. Fake engines: no timing is asserted."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from benchmarks.emu_decode import interleaved, medians, no_end_of_turn, prompt_ids

EOS = 2


class FakeEngine:
    def __init__(self, name, log, ms):
        self.name, self.log, self.ms = name, log, ms
        self.stop_ids = frozenset({EOS})

    def reset(self):
        self.log.append((self.name, "reset"))

    def generate(self, ids, max_new_tokens):
        self.log.append((self.name, "generate", tuple(ids), max_new_tokens))
        toks = [5, EOS, 7, 8, 9, 10][:max_new_tokens]
        if EOS in self.stop_ids and EOS in toks:
            toks = toks[:toks.index(EOS) + 1]
        return SimpleNamespace(tokens=toks, ttft_s=0.1, prefill_tok_s=300.0, decode_tok_s=1e3 / self.ms,
                               ms_per_token=self.ms)


def test_runs_are_warmed_interleaved_and_of_equal_length():
    log = []
    engines = {"bf16": FakeEngine("bf16", log, 10.0), "q4": FakeEngine("q4", log, 8.0)}
    runs = interleaved(engines, [11, 12, 13], n_tokens=5, reps=3)
    warm = [e for e in log if e[1] == "generate" and e[3] == 4]
    assert [e[0] for e in log[:4]] == ["bf16", "bf16", "q4", "q4"] and len(warm) == 2      # both warmed first
    timed = [e for e in log[4:] if e[1] == "generate"]
    assert [e[0] for e in timed] == ["bf16", "q4", "q4", "bf16", "bf16", "q4"]            # order alternates
    assert {e[2] for e in timed} == {(11, 12, 13)} and {e[3] for e in timed} == {5}
    resets = [e for e in log[4:] if e[1] == "reset"]
    assert len(resets) == len(timed)                                                       # each run from a reset
    assert all(len(r.tokens) == 5 for rs in runs.values() for r in rs)                    # EOS did not stop them
    assert all(e.stop_ids == frozenset({EOS}) for e in engines.values())                  # and comes back
    assert medians(runs["q4"])["ms_per_token"] == 8.0 and len(runs["bf16"]) == 3


def test_a_short_run_is_an_error_and_the_stop_ids_come_back():
    eng = FakeEngine("q4", [], 8.0)
    with pytest.raises(RuntimeError, match="q4: 6 tokens generated, 9 asked"):
        interleaved({"q4": eng}, [1], n_tokens=9, reps=1)
    assert eng.stop_ids == frozenset({EOS})
    with pytest.raises(ValueError), no_end_of_turn(eng):
        assert eng.stop_ids == frozenset()
        raise ValueError
    assert eng.stop_ids == frozenset({EOS})


def test_prompt_has_the_asked_token_count():
    tok = SimpleNamespace(encode=lambda text, add_special_tokens=False: list(range(len(text.split()))))
    assert len(prompt_ids(tok)) == 30 and len(prompt_ids(tok, 50)) == 50
