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


def test_qwen2_without_its_bias_tensors(capsys, tmp_path):
    """Qwen2 is supported (q/k/v biases); a checkpoint lacking the bias tensors is refused from the headers."""
    d = write_numpy_checkpoint(tmp_path / "qwen", config_overrides={
        "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "attention_bias": True})
    code, lines = run_main(capsys, ["run", "--prompt", "hi", "--model", str(d), "--device", "emu"])
    assert_one_line(code, lines, "_proj.bias is missing from the checkpoint")


def test_unsupported_architecture_lists_the_supported(capsys, tmp_path):
    d = write_numpy_checkpoint(tmp_path / "s2", config_overrides={
        "architectures": ["Starcoder2ForCausalLM"], "model_type": "starcoder2"})
    code, lines = run_main(capsys, ["run", "--prompt", "hi", "--model", str(d), "--device", "emu"])
    assert_one_line(code, lines, "unsupported architecture Starcoder2ForCausalLM")
    for arch in ("LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM", "MistralForCausalLM", "Phi3ForCausalLM"):
        assert arch in lines[0]


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


@pytest.mark.parametrize("argv_env", [(["--device", "bogus"], {}), ([], {"DEVICE": "bogus"})],
                         ids=["flag", "env"])
def test_unknown_device(capsys, tiny_model_dir, monkeypatch, argv_env):
    extra, env = argv_env
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    code, lines = run_main(capsys, ["run", "--prompt", "hi", "--model", str(tiny_model_dir), *extra])
    assert_one_line(code, lines, "unknown device 'bogus'")


@pytest.mark.parametrize("flag,value,needle", [
    ("--temperature", "-1", "must be a number >= 0"), ("--temperature", "nan", "must be a number >= 0"),
    ("--top-k", "-3", "must be an integer >= 0"), ("--top-p", "0", "must be in (0, 1]"),
    ("--top-p", "1.5", "must be in (0, 1]"), ("--buckets", "64,abc", "comma-separated positive integers")])
def test_bad_sampling_and_bucket_values(capsys, tiny_model_dir, flag, value, needle):
    code, lines = run_main(capsys, ["run", "--prompt", "hi", "--model", str(tiny_model_dir), flag, value])
    assert_one_line(code, lines, needle)


def test_prompt_longer_than_largest_bucket_still_runs(capsys, tiny_model_dir, tmp_path):
    # 80 words > bucket 64: the first 64 tokens are prefilled, the rest go through decode
    code = main(["run", "--prompt", "hello " * 80, "-n", "2", "--buckets", "64", "--model", str(tiny_model_dir),
                 "--raw", "--device", "emu", "--no-progress", "--cache-dir", str(tmp_path / "k")])
    out = capsys.readouterr().out
    assert code == 0 and "prompt)" in out, out


def test_ctrl_c_stops_the_reply_then_interrupts():
    """First Ctrl-C sets the stop event (the reply ends after the current token, timings still print);
    a second one (e.g. during a long prefill) raises KeyboardInterrupt; the old handler comes back."""
    import signal

    from llama_npu.cli import _ctrl_c_stops_reply

    before = signal.getsignal(signal.SIGINT)
    with pytest.raises(KeyboardInterrupt):
        with _ctrl_c_stops_reply() as stop:
            os.kill(os.getpid(), signal.SIGINT)
            assert stop.is_set()
            os.kill(os.getpid(), signal.SIGINT)
    assert signal.getsignal(signal.SIGINT) is before


def test_chat_keeps_history_and_clear_resets(capsys, tiny_model_dir, monkeypatch, tmp_path):
    """Piped stdin: turn 2's prompt holds turn 1 (longer prompt), /clear starts over, EOF exits 0."""
    import io
    import re

    monkeypatch.setattr("sys.stdin", io.StringIO("hello world\n\nhello world\n/clear\nhello world\n"))
    code = main(["chat", "--model", str(tiny_model_dir), "--device", "emu", "--no-progress", "-n", "3",
                 "--buckets", "64", "--cache-dir", str(tmp_path / "k")])
    err = capsys.readouterr().err
    assert code == 0, err
    lens = [int(n) for n in re.findall(r"\((\d+)-token prompt\)", err)]
    assert len(lens) == 3 and lens[1] > lens[0] and lens[2] == lens[0], err
    assert "conversation cleared" in err and "Traceback" not in err


@pytest.mark.parametrize("template,needle", [("{{ raise_exception('roles must alternate') }}", "roles must alternate"),
                                             ("{% if %}", "cannot parse the chat template")])
def test_chat_template_errors_are_one_line(capsys, tmp_path, template, needle):
    d = write_numpy_checkpoint(tmp_path / "m")
    cfg = json.loads((d / "tokenizer_config.json").read_text())
    cfg["chat_template"] = template
    (d / "tokenizer_config.json").write_text(json.dumps(cfg))
    code, lines = run_main(capsys, ["run", "--prompt", "hi", "--model", str(d)])
    assert_one_line(code, lines, needle)


def test_unusable_kernel_cache_dir_is_one_line(capsys, tiny_model_dir, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    code, lines = run_main(capsys, ["run", "--model", str(tiny_model_dir), "--prompt", "hello", "-n", "2",
                                    "--device", "emu", "--no-progress", "--cache-dir", str(blocker / "k")])
    assert code == 1 and len(lines) == 1 and "not usable" in lines[0], lines
