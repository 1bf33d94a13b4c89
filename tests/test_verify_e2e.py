"""End-to-end gate on the embedded model (SmolLM2-135M-Instruct) on emu, plus proofs that it can FAIL.

Expensive pieces are module-scoped: the model conversion happens once per machine (`make setup` does it
first), the HF reference loads in ~1 s, our engine once for bucket 64 (every quick prompt fits).
"""
from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tooling import require_module
from verify import cli
from verify.gate import compare
from verify.prompt_set import PROMPTS_DIR, load_prompts

ROOT = Path(__file__).resolve().parents[1]
N_TOKENS = 8          # fewer than `make verify`'s 32 to keep CI time low
BUCKETS = (64,)       # every shipped prompt + N_TOKENS fits one 64-row bucket


@pytest.fixture(scope="module")
def torch_stack():
    return require_module("torch"), require_module("transformers")


@pytest.fixture(scope="module")
def model_dir(torch_stack):
    from llama_npu.model_source import resolve_model

    return resolve_model(None, progress=False)


@pytest.fixture(scope="module")
def reference(model_dir):
    from verify.hf_runner import HFReference

    return HFReference.load(model_dir)


@pytest.fixture(scope="module")
def runtime(model_dir):
    from verify.npu_runner import OurRuntime

    return OurRuntime.load(None, device="emu", buckets=BUCKETS, progress=False)


def _run_prompts(runtime, reference, prompts, n_tokens=N_TOKENS):
    return [cli.verify_prompt(p, runtime, reference, n_tokens, 5) for p in prompts]


# ---- HF side only -----------------------------------------------------------------------------------

def test_our_prompt_ids_equal_hf_autotokenizer(model_dir, torch_stack):
    from transformers import AutoTokenizer

    from llama_npu.tokenizer import Tokenizer

    ours, hf = Tokenizer(model_dir), AutoTokenizer.from_pretrained(str(model_dir))
    for p in load_prompts(PROMPTS_DIR, full=True):
        if p.chat:
            expected = hf.apply_chat_template([{"role": "user", "content": p.text}], add_generation_prompt=True,
                                              tokenize=True, return_dict=False)
        else:
            expected = hf(p.text, add_special_tokens=True)["input_ids"]
        assert p.token_ids(ours) == [int(i) for i in expected], p.name


def test_full_set_holds_a_prompt_past_4096_tokens(model_dir):
    """Long context (issue 14): `verify --full` crosses the old 4096-token limit with one prompt."""
    from llama_npu.tokenizer import Tokenizer

    tok = Tokenizer(model_dir)
    longest = max(len(p.token_ids(tok)) for p in load_prompts(PROMPTS_DIR, full=True))
    assert 4096 < longest <= 8192 - 64


def test_hf_greedy_matches_transformers_generate(reference, model_dir):
    from llama_npu.tokenizer import Tokenizer

    torch = reference.torch
    ids = load_prompts(PROMPTS_DIR, full=False)[0].token_ids(Tokenizer(model_dir))
    trace = reference.greedy(ids, N_TOKENS, 5)
    out = reference.model.generate(torch.tensor([ids]), max_new_tokens=N_TOKENS, do_sample=False,
                                   pad_token_id=0)
    assert trace.tokens == out[0, len(ids):].tolist()
    assert all(t == row[0] for t, row in zip(trace.tokens, trace.topk))


def test_hf_layer_hooks_match_hidden_states_except_normed_last(reference):
    ids = [1, 504, 3575, 282, 4649, 314]
    hooks, hs = reference.layer_outputs(ids)
    n = reference.n_layers
    assert len(hooks) == len(hs) == n
    for i in range(n - 1):
        np.testing.assert_array_equal(hooks[i], hs[i])
    assert not np.allclose(hooks[-1], hs[-1])  # hidden_states[-1] has the final RMSNorm applied


def test_reference_that_cannot_load_exits_2(tmp_path, capsys, torch_stack):
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "config.json").write_text(json.dumps({"model_type": "no-such-architecture"}))
    from verify.hf_runner import HFReference, ReferenceUnavailable

    with pytest.raises(ReferenceUnavailable, match="cannot load the model"):
        HFReference.load(bad)
    with pytest.raises(ReferenceUnavailable, match="no config.json"):
        HFReference.load(tmp_path)
    assert cli.main(["verify", "--model", str(tmp_path / "missing")]) == 2
    assert "does not exist" in capsys.readouterr().err


@pytest.mark.parametrize("case", ["gpt2", "truncated", "bogus-device", "null-device", "bad-arg"])
def test_cannot_run_is_one_line_exit_2(tmp_path, capsys, torch_stack, case):
    """Our cheap checks (device name, config.json, safetensors headers) run before HF loads anything, so
    the user sees our one-line reason, not a transformers load report or a traceback."""
    from checkpoints import write_numpy_checkpoint

    d = write_numpy_checkpoint(tmp_path / "m")
    argv = ["verify", "--model", str(d), "--report-dir", str(tmp_path / "r")]
    needle = {"gpt2": "unsupported architecture GPT2LMHeadModel", "truncated": "truncated safetensors file",
              "bogus-device": "unknown device 'bogus'", "null-device": "computes no numbers",
              "bad-arg": "must be a positive integer"}[case]
    if case == "gpt2":
        (d / "config.json").write_text(json.dumps({"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2"}))
    elif case == "truncated":
        f = d / "model.safetensors"
        f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    elif case in ("bogus-device", "null-device"):
        argv += ["--device", case.split("-")[0]]
    else:
        argv += ["--n-tokens", "abc"]
    try:
        rc = cli.main(argv)
    except SystemExit as e:
        rc = e.code
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert rc == 2 and len(lines) == 1 and needle in lines[0], lines


def test_missing_torch_names_install_command(tmp_path):
    # A meta-path blocker makes `import torch` fail in a fresh interpreter.
    code = ("import sys\n"
            "class Block:\n"
            "    def find_spec(self, name, path=None, target=None):\n"
            "        if name.split('.')[0] in ('torch', 'transformers'):\n"
            "            raise ImportError(f'No module named {name!r}', name=name)\n"
            "sys.meta_path.insert(0, Block())\n"
            "from verify.cli import main\n"
            "sys.exit(main(['verify', '--report-dir', sys.argv[1]]))\n")
    r = subprocess.run([sys.executable, "-c", code, str(tmp_path)], cwd=ROOT, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 2, r.stderr
    assert "pip install 'llama-npu[verify]'" in r.stderr and "make setup" in r.stderr


# ---- our runtime vs HF -----------------------------------------------------------------------------

def test_quick_subset_passes_on_emu(runtime, reference, tmp_path, capsys):
    args = cli.build_parser().parse_args(["verify", "--n-tokens", str(N_TOKENS), "--report-dir", str(tmp_path)])
    rc = cli.run_verify(args, runtime=runtime, reference=reference)
    out = capsys.readouterr().out
    assert rc == 0, out
    assert out.rstrip().splitlines()[-1].startswith("[verify] PASS")
    data = json.loads((tmp_path / "report.json").read_text())
    assert data["result"] == "PASS" and data["n_prompts"] == 2 and data["device"] == "emu"
    for p in data["prompts"]:
        assert len(p["ours"]["tokens"]) >= 1 and p["verdict"]["passed"]
    assert (tmp_path / "report.md").read_text().startswith("# verify: PASS")


def test_diagnosis_rows_per_layer_with_high_cosine(runtime, reference, capsys):
    args = cli.build_parser().parse_args(["diagnosis"])
    assert cli.run_diagnosis(args, runtime=runtime, reference=reference) == 0
    out = capsys.readouterr().out.splitlines()
    rows = [l for l in out if l.strip() and l.split()[0].isdigit()]
    assert len(rows) == runtime.engine.shapes.n_layers == 30
    assert min(float(r.split()[1]) for r in rows) >= 0.99


def test_perturbed_kernel_reference_fails_the_gate(runtime, reference, monkeypatch):
    """An rmsnorm that forgets its weight (a plausible bug) in the emulator must make the gate FAIL."""
    from kernel_builder import reference as refk

    original = refk.KERNELS["rmsnorm"]

    def rmsnorm_without_weight(x, w, **params):
        return original(x, np.ones(np.shape(w), dtype=np.float32), **params)

    monkeypatch.setitem(refk.KERNELS, "rmsnorm", rmsnorm_without_weight)
    results = _run_prompts(runtime, reference, load_prompts(PROMPTS_DIR, full=False), n_tokens=4)
    assert results and not any(r.verdict.passed for r in results), [r.verdict for r in results]
    for r in results:  # a real bug shows as a token outside the other side's top-5, not as drift
        assert r.verdict.ours_in_ref_topk is False or r.verdict.ref_in_ours_topk is False


def test_swapped_wiring_fails_the_gate(model_dir, reference, monkeypatch, tmp_path):
    """Swap wk/wv in the prefill qkv declaration derived from the layer graph (same shapes, so it builds
    and runs): the stitched text carries the wrong wiring, emu executes it, and the gate must FAIL."""
    from llama_npu.models.llama import LlamaModel
    from verify.npu_runner import OurRuntime

    original = LlamaModel.prefill

    def swapped(self, rows, kv_rows=None, variant=""):
        plan = original(self, rows, kv_rows, variant)
        qkv = plan.steps[0].decl
        rewired = {"k": ("h", "wv", "k"), "v_new": ("h", "wk", "v_new")}
        launches = tuple(dataclasses.replace(l, wiring=rewired.get(l.prefix, l.wiring)) for l in qkv.launches)
        assert launches != qkv.launches
        steps = (dataclasses.replace(plan.steps[0], decl=dataclasses.replace(qkv, launches=launches)),)
        return dataclasses.replace(plan, steps=steps + plan.steps[1:])

    monkeypatch.setattr(LlamaModel, "prefill", swapped)
    broken = OurRuntime.load(None, device="emu", buckets=BUCKETS, cache_dir=tmp_path / "kernels", progress=False)
    prompt = load_prompts(PROMPTS_DIR, full=False)[0]
    ids = prompt.token_ids(broken.tokenizer)
    v = compare(broken.greedy(ids, 4, 5), reference.greedy(ids, 4, 5, eos_ids=broken.eos_ids))
    assert not v.passed, v
