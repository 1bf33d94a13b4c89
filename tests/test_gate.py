"""The pure top-k gate rule (verify.gate): hand-made traces, no model."""
from __future__ import annotations

import numpy as np
import pytest

from verify.gate import Trace, compare, greedy_token, topk_ids


def tr(tokens, topk, stop="length", finite=True):
    return Trace(list(tokens), [tuple(r) for r in topk], stop=stop, finite=finite)


# ---- top-k ordering ---------------------------------------------------------------------------------

def test_topk_orders_by_logit_then_smaller_id():
    logits = np.array([0.0, 3.0, 1.0, 3.0, 2.0, 3.0], dtype=np.float32)
    assert topk_ids(logits, 3) == (1, 3, 5)
    assert topk_ids(logits, 5) == (1, 3, 5, 4, 2)


def test_topk_tie_at_the_cut_keeps_smaller_ids():
    # ids 7, 2, 9 tie for the last two slots: the smaller ids (2, 7) win, regardless of position.
    logits = np.zeros(10, dtype=np.float32)
    logits[[7, 2, 9]] = 1.0
    logits[4] = 5.0
    assert topk_ids(logits, 3) == (4, 2, 7)


def test_topk_all_equal_is_first_k_ids_like_argmax():
    logits = np.full(100, 0.25, dtype=np.float32)
    assert topk_ids(logits, 5) == (0, 1, 2, 3, 4)
    assert greedy_token(logits) == int(np.argmax(logits)) == 0


def test_greedy_matches_argmax_on_random_bf16_like_logits():
    rng = np.random.default_rng(0)
    for _ in range(50):
        # coarse quantisation produces many ties, as bf16 logits do
        logits = np.round(rng.normal(size=2000) * 4) / 4
        assert greedy_token(logits) == int(np.argmax(logits))
        full = sorted(range(logits.size), key=lambda i: (-logits[i], i))[:5]
        assert topk_ids(logits, 5) == tuple(full)


def test_topk_nan_ranks_last():
    logits = np.array([np.nan, 1.0, 2.0, np.nan, 0.5])
    assert topk_ids(logits, 3) == (2, 1, 4)


def test_topk_bad_k():
    with pytest.raises(ValueError, match="k >= 1"):
        topk_ids(np.zeros(4), 0)
    with pytest.raises(ValueError, match="at least 5 logits"):
        topk_ids(np.zeros(4), 5)


# ---- the rule ---------------------------------------------------------------------------------------

def test_identical_sequences_pass():
    a = tr([5, 6, 7], [(5, 1, 2), (6, 1, 2), (7, 1, 2)])
    b = tr([5, 6, 7], [(5, 9, 8), (6, 9, 8), (7, 9, 8)])
    v = compare(a, b)
    assert v.passed and v.steps_compared == 3 and v.divergence_step is None


def test_divergence_with_mutual_topk_passes_and_ends_comparison():
    a = tr([5, 6, 11, 99], [(5, 1), (6, 7), (11, 12), (99, 0)])
    b = tr([5, 6, 12, 42], [(5, 1), (6, 7), (12, 11), (42, 3)])
    v = compare(a, b)
    assert v.passed
    assert v.divergence_step == 2 and v.steps_compared == 3
    assert (v.ours_token, v.ref_token) == (11, 12)
    assert v.ours_in_ref_topk and v.ref_in_ours_topk


def test_later_steps_after_divergence_are_not_judged():
    # step 3 would fail badly, but the comparison ended at step 1
    a = tr([1, 2, 3, 4], [(1,), (2, 3), (3,), (4,)])
    b = tr([1, 3, 8, 9], [(1,), (3, 2), (8,), (9,)])
    assert compare(a, b).passed


def test_divergence_outside_both_topk_fails():
    a = tr([5, 6], [(5, 1, 2), (6, 1, 2)])
    b = tr([5, 9], [(5, 1, 2), (9, 3, 4)])
    v = compare(a, b)
    assert not v.passed
    assert v.divergence_step == 1
    assert v.ours_in_ref_topk is False and v.ref_in_ours_topk is False
    assert "not in reference top-k" in v.reason and "not in our top-k" in v.reason


@pytest.mark.parametrize("ours_has_ref,ref_has_ours", [(True, False), (False, True)])
def test_one_sided_inclusion_fails(ours_has_ref, ref_has_ours):
    ours_top = (6, 9) if ours_has_ref else (6, 1)
    ref_top = (9, 6) if ref_has_ours else (9, 1)
    v = compare(tr([6], [ours_top]), tr([9], [ref_top]))
    assert not v.passed
    assert v.ours_in_ref_topk is ref_has_ours
    assert v.ref_in_ours_topk is ours_has_ref


def test_divergence_at_step_zero():
    v = compare(tr([3, 4], [(3, 7), (4,)]), tr([7, 1], [(7, 3), (1,)]))
    assert v.passed and v.divergence_step == 0 and v.steps_compared == 1


def test_ties_decided_by_smaller_id_make_both_sides_agree():
    # Same logits on both sides with a tie at the top: both pick the smaller id -> identical, pass.
    logits = np.array([0.0, 2.0, 2.0, 1.0])
    a = tr([greedy_token(logits)], [topk_ids(logits, 2)])
    b = tr([int(np.argmax(logits))], [topk_ids(logits, 2)])
    assert a.tokens == b.tokens == [1]
    assert compare(a, b).passed


def test_tie_break_decides_inclusion_at_the_cut():
    # Reference logits tie ids 3 and 8 for the 2nd slot with k=2: id 3 is kept, 8 is dropped.
    ref_logits = np.zeros(10)
    ref_logits[[5, 3, 8]] = [2.0, 1.0, 1.0]
    ref = tr([5], [topk_ids(ref_logits, 2)])
    assert ref.topk[0] == (5, 3)
    assert compare(tr([3], [(3, 5)]), ref).passed
    assert not compare(tr([8], [(8, 5)]), ref).passed


def test_shorter_side_stopped_by_eos_diverges_under_same_rule():
    eos = 2
    # ours chose EOS at step 2 (EOS in ref's top-k and ref's token in ours) -> pass
    ours = tr([10, 11, eos], [(10,), (11,), (eos, 12)], stop="eos")
    ref = tr([10, 11, 12, 13], [(10,), (11,), (12, eos), (13,)])
    v = compare(ours, ref)
    assert v.passed and v.divergence_step == 2 and (v.ours_token, v.ref_token) == (eos, 12)
    # same, but the reference never considered EOS -> fail
    ref_bad = tr([10, 11, 12, 13], [(10,), (11,), (12, 40), (13,)])
    v = compare(ours, ref_bad)
    assert not v.passed and v.divergence_step == 2 and v.ours_in_ref_topk is False
    # and symmetrically when the reference stops early
    v = compare(ref_bad, ours)
    assert not v.passed and v.divergence_step == 2 and v.ref_in_ours_topk is False


def test_length_difference_without_divergence_compares_shorter_prefix():
    ours = tr([1, 2, 3], [(1,), (2,), (3,)], stop="context")
    ref = tr([1, 2, 3, 4, 5], [(1,), (2,), (3,), (4,), (5,)])
    v = compare(ours, ref)
    assert v.passed and v.steps_compared == 3 and v.divergence_step is None
    assert "context" in v.reason


def test_non_finite_or_empty_fails():
    good = tr([1], [(1,)])
    assert not compare(tr([1], [(1,)], finite=False), good).passed
    assert "non-finite" in compare(good, tr([1], [(1,)], finite=False)).reason
    assert not compare(tr([], []), good).passed


def test_trace_shape_is_validated():
    with pytest.raises(ValueError, match="2 tokens but 1 top-k rows"):
        Trace([1, 2], [(1,)])


# ---- supporting pure pieces: prompts, report, diagnosis statistics ----------------------------------

import json  # noqa: E402

from verify import diagnosis, gate_report as report # noqa: E402
from verify.prompt_set import PROMPTS_DIR, load_prompts  # noqa: E402


def test_shipped_prompts_mix_chat_and_raw_with_two_quick():
    everything = load_prompts(PROMPTS_DIR, full=True)
    assert len(everything) >= 8
    assert {p.chat for p in everything} == {True, False}
    quick = load_prompts(PROMPTS_DIR, full=False)
    assert len(quick) == 2 and {p.chat for p in quick} == {True, False}


def test_prompt_files_are_validated(tmp_path):
    (tmp_path / "a.json").write_text(json.dumps({"name": "a", "prompt": "hi"}))
    with pytest.raises(ValueError, match=r"missing field\(s\) \['chat'\]"):
        load_prompts(tmp_path)
    (tmp_path / "a.json").write_text(json.dumps({"name": "a", "prompt": "hi", "chat": "yes"}))
    with pytest.raises(ValueError, match="'chat' must be true or false"):
        load_prompts(tmp_path)
    (tmp_path / "a.json").write_text(json.dumps({"name": "a", "prompt": "hi", "chat": False}))
    with pytest.raises(ValueError, match="no prompt marked"):
        load_prompts(tmp_path, full=False)
    with pytest.raises(ValueError, match="does not exist"):
        load_prompts(tmp_path / "nope")


def test_prompt_file_is_placed_before_the_prompt(tmp_path):
    (tmp_path / "a.json").write_text(json.dumps({"name": "a", "prompt": " Q?", "chat": True,
                                                 "prompt_file": "doc.txt", "quick": True}))
    with pytest.raises(ValueError, match="prompt_file 'doc.txt' does not exist"):
        load_prompts(tmp_path)
    (tmp_path / "doc.txt").write_text("A long document.")
    (p,) = load_prompts(tmp_path)
    assert p.text == "A long document. Q?"


def test_prompt_token_ids_use_template_or_raw_encoding():
    class Tok:
        def apply_chat_template(self, messages, add_generation_prompt=True):
            assert messages == [{"role": "user", "content": "x"}] and add_generation_prompt
            return [1, 2, 3]

        def encode(self, text, add_special_tokens=True):
            assert add_special_tokens
            return [9]

    from verify.prompt_set import Prompt
    assert Prompt("c", "x", chat=True).token_ids(Tok()) == [1, 2, 3]
    assert Prompt("r", "x", chat=False).token_ids(Tok()) == [9]


def _report(passed_second: bool):
    ok = tr([1, 2], [(1, 5), (2, 6)])
    other = tr([1, 3], [(1, 5), (3, 2 if passed_second else 7)])
    ours2 = tr([1, 2], [(1, 5), (2, 3 if passed_second else 8)])
    res = [report.PromptResult("p1", True, [7, 8], ok, ok, compare(ok, ok)),
           report.PromptResult("p2", False, [9], ours2, other, compare(ours2, other))]
    return report.VerifyReport("m", "emu", 2, 5, False, res, settings={"torch_threads": 2})


def test_report_pass_and_fail_files(tmp_path):
    decode = lambda ids: "".join(f"<{i}>" for i in ids)  # noqa: E731
    good = _report(True)
    assert good.passed
    js, md = report.write(good, tmp_path / "r", decode)
    data = json.loads(js.read_text())
    assert data["result"] == "PASS" and data["n_prompts"] == 2 and data["subset"] == "quick"
    assert data["prompts"][1]["verdict"]["divergence_step"] == 1
    assert data["prompts"][1]["ours"]["text"] == "<1><2>"
    assert "# verify: PASS" in md.read_text()

    bad = _report(False)
    assert not bad.passed
    table = report.console_table(bad, decode)
    lines = table.splitlines()
    assert len(lines) == 4 and "top5" in lines[0]
    assert lines[3].split()[0] == "p2" and lines[3].rstrip().endswith("FAIL") and " NO " in lines[3]
    report.write(bad, tmp_path / "r", decode)
    assert json.loads((tmp_path / "r" / "report.json").read_text())["result"] == "FAIL"


def test_report_without_results_is_not_a_pass():
    assert not report.VerifyReport("m", "emu", 2, 5, False, []).passed


def test_row_cosines_and_layer_stats():
    rng = np.random.default_rng(1)
    ref = rng.normal(size=(4, 16))
    same = diagnosis.layer_stats([ref.copy()], [ref])[0]
    assert same.cos_min == pytest.approx(1.0) and same.max_abs == 0.0
    worse = ref.copy()
    worse[2] = -worse[2]  # one flipped row: min cosine -1, median still 1
    s = diagnosis.layer_stats([ref, worse], [ref, ref])[1]
    assert s.layer == 1 and s.cos_min == pytest.approx(-1.0) and s.cos_median == pytest.approx(1.0)
    assert s.max_abs == pytest.approx(2 * np.abs(ref[2]).max())
    zero = np.zeros((2, 3))
    assert list(diagnosis.row_cosines(zero, zero)) == [1.0, 1.0]
    assert list(diagnosis.row_cosines(zero, np.ones((2, 3)))) == [0.0, 0.0]
    nan = np.full((1, 3), np.nan)
    assert diagnosis.row_cosines(nan, np.ones((1, 3)))[0] == -1.0
    with pytest.raises(ValueError, match="matching"):
        diagnosis.row_cosines(np.ones((2, 3)), np.ones((3, 3)))
    with pytest.raises(ValueError, match="2 layer outputs, the reference 1"):
        diagnosis.layer_stats([ref, ref], [ref])
    table = diagnosis.format_table(diagnosis.layer_stats([ref] * 3, [ref] * 3))
    assert len(table.splitlines()) == 2 + 3
