"""Bad inputs through the CLI: each gives ONE line on stderr (no traceback) and exit code 2."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from llama_npu.cli import main
from checkpoints import write_numpy_checkpoint

ROOT = Path(__file__).resolve().parents[1]


def run_main(capsys, argv):
    try:
        code = main(argv)
    except SystemExit as e:  # argparse errors
        code = e.code
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    return code, lines


def assert_one_line(code, lines, needle):
    assert code == 2
    assert len(lines) == 1, lines
    assert "Traceback" not in lines[0]
    assert needle in lines[0], lines[0]


def test_missing_model_path(capsys, tmp_path):
    code, lines = run_main(capsys, ["run", "--prompt", "hi", "--model", str(tmp_path / "missing")])
    assert_one_line(code, lines, "does not exist")


def test_unsupported_architecture(capsys, tmp_path):
    d = tmp_path / "gpt2"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2",
                                               "n_embd": 768, "n_layer": 12}))
    code, lines = run_main(capsys, ["run", "--prompt", "hi", "--model", str(d)])
    assert_one_line(code, lines, "unsupported architecture GPT2LMHeadModel")


def test_qwen2_with_qkv_bias(capsys, tmp_path):
    d = write_numpy_checkpoint(tmp_path / "qwen", config_overrides={
        "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "attention_bias": True})
    code, lines = run_main(capsys, ["run", "--prompt", "hi", "--model", str(d), "--device", "emu"])
    assert_one_line(code, lines, "unsupported architecture Qwen2ForCausalLM")


def test_truncated_safetensors(capsys, tmp_path):
    d = write_numpy_checkpoint(tmp_path / "trunc")
    f = d / "model.safetensors"
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    code, lines = run_main(capsys, ["run", "--prompt", "hello", "--model", str(d), "--device", "emu",
                                    "--no-progress", "--cache-dir", str(tmp_path / "k")])
    assert_one_line(code, lines, "truncated safetensors file")
    assert "model.safetensors" in lines[0]


def test_missing_tensor(capsys, tmp_path):
    from llama_npu.weights import Checkpoint, ModelWeights
    from llama_npu.config import load_config
    from llama_npu.errors import WeightsError
    from checkpoints import write_safetensors

    d = write_numpy_checkpoint(tmp_path / "m")
    ck = Checkpoint(d)
    tensors = {n: ck.get(n).copy() for n in ck.refs if "mlp.up_proj" not in n}
    write_safetensors(d / "model.safetensors", tensors)
    with pytest.raises(WeightsError, match=r"tensor model\.layers\.0\.mlp\.up_proj\.weight is missing"):
        ModelWeights(load_config(d))


def test_empty_prompt(capsys, tiny_model_dir):
    code, lines = run_main(capsys, ["run", "--prompt", "   ", "--model", str(tiny_model_dir)])
    assert_one_line(code, lines, "empty prompt")


def test_prompt_plus_tokens_beyond_context(capsys, tiny_model_dir):
    code, lines = run_main(capsys, ["run", "--prompt", "hello world", "-n", "300", "--model", str(tiny_model_dir)])
    assert_one_line(code, lines, "exceeds the model's context of 256 tokens")


@pytest.mark.parametrize("bad", ["0", "-3", "abc", "2.5"])
def test_n_tokens_not_positive_integer(capsys, tiny_model_dir, bad):
    code, lines = run_main(capsys, ["run", "--prompt", "hi", "-n", bad, "--model", str(tiny_model_dir)])
    assert_one_line(code, lines, "must be a positive integer")


def test_npu_without_toolchain(capsys, tiny_model_dir, monkeypatch):
    from kernel_builder import toolchain

    if toolchain.detect().complete:
        pytest.skip("a complete NPU toolchain is installed here")
    code, lines = run_main(capsys, ["run", "--prompt", "hi", "--model", str(tiny_model_dir), "--device", "npu"])
    assert_one_line(code, lines, "DEVICE=npu but the NPU toolchain is incomplete")


def test_subprocess_entry_point(tmp_path):
    """`python -m llama_npu` prints the same single line and exits 2."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    p = subprocess.run([sys.executable, "-m", "llama_npu", "run", "--prompt", "x", "--model",
                        str(tmp_path / "nope")], capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)
    assert p.returncode == 2
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "does not exist" in lines[0]
