"""Every size the kernels constrain is checked before any weight is read: one line naming the constraint and the
nearest valid value (llama_npu/sizes.py), never a kernel traceback; damaged tokenizer files and a truncated
checkpoint are one line too (run and prepare-model)."""
from __future__ import annotations

import json

import pytest

from checkpoints import write_numpy_checkpoint
from test_cli_errors import assert_one_line, run_main


@pytest.fixture
def no_weight_reads(monkeypatch):
    """Fails the test if any tensor byte is read (headers are fine)."""
    from llama_npu.weights import Checkpoint

    def boom(*_a, **_k):
        raise AssertionError("a weight was read before the size check")

    monkeypatch.setattr(Checkpoint, "read_into", boom)
    monkeypatch.setattr(Checkpoint, "get", boom)


def _run(capsys, model_dir, *extra, command="run"):
    argv = [command, "--model", str(model_dir), "--device", "emu", "--no-progress", "-n", "2", *extra]
    if command == "run":
        argv += ["--raw", "--prompt", "hello"]
    return run_main(capsys, argv)


@pytest.mark.parametrize("extra,needle", [
    (["--buckets", "3"], "--buckets 3: a prefill bucket must be a multiple of 16 (the attention kernel's 16-key K/V "
                         "tiles); nearest valid: 16"),
    (["--buckets", "12"], "--buckets 12: a prefill bucket must be a multiple of 16"),
    (["--buckets", "44"], "nearest valid: 48"),
    (["--buckets", "64,100000"], "--buckets 100000 exceeds the model's context of 256 positions; the largest useful "
                                 "bucket is 256"),
    (["--buckets", "128", "--context", "100"], "--buckets 128 exceeds this run's --context of 100 positions; the "
                                                "largest useful bucket is 96"),
    (["--context", "8"], "--context 8 is too small: a run needs at least 16 positions (one prefill bucket of 16 rows); "
                         "nearest valid: 16"),
    (["--context", "15"], "--context 15 is too small"),
    (["--context", "300"], "--context 300 exceeds the model's context of 256 positions"),
    (["--seed", "-1"], "argument --seed: must be an integer in [0, 2**64), got '-1'"),
])
def test_bad_sizes_are_one_line(capsys, tiny_model_dir, no_weight_reads, extra, needle):
    assert_one_line(*_run(capsys, tiny_model_dir, *extra), needle)


def test_chat_context_1(capsys, tiny_model_dir, no_weight_reads):
    assert_one_line(*_run(capsys, tiny_model_dir, "--context", "1", command="chat"), "--context 1 is too small")


def test_serve_and_compile_check_the_same_sizes(capsys, tiny_model_dir, no_weight_reads):
    assert_one_line(*run_main(capsys, ["compile", "--model", str(tiny_model_dir), "--buckets", "12", "--device", "emu",
                                       "--no-progress"]), "a prefill bucket must be a multiple of 16")
    assert_one_line(*run_main(capsys, ["serve", "--model", str(tiny_model_dir), "--context", "8", "--port", "0",
                                       "--device", "emu", "--no-progress"]), "--context 8 is too small")


@pytest.mark.parametrize("kw,needle", [
    ({"hidden": 594, "n_heads": 6, "n_kv_heads": 2, "config_overrides": {"head_dim": 64}},
     "hidden_size 594 is not supported yet: the kernels need a multiple of 32 (the GEMV, RMSNorm and add kernels' "
     "32-lane bf16 vectors); the nearest supported hidden_size is 576 or 608"),
    ({"hidden": 192, "n_heads": 4, "n_kv_heads": 2}, "head_dim 48 is not supported yet: the kernels need a multiple "
                                                     "of 32"),
    ({"ffn": 500}, "intermediate_size 500 is not supported yet: the kernels need a multiple of 32"),
    # past an L1 budget (the GEMV's x of 32768 elements): planning fails before the checkpoint is opened, so the
    # small checkpoint's tensors never matter
    ({"config_overrides": {"hidden_size": 32768, "head_dim": 64}},
     "these model sizes are not supported by the kernels yet (gemv: m="),
])
def test_model_sizes_the_kernels_cannot_take(capsys, tmp_path, no_weight_reads, kw, needle):
    d = write_numpy_checkpoint(tmp_path / "m", **kw)
    assert_one_line(*_run(capsys, d, "--cache-dir", str(tmp_path / "k")), needle)


def test_vocab_has_no_constraint_and_context_17_runs(capsys, tmp_path):
    """Any vocabulary size (the LM head's partitions are zero-padded); --context 17 gets one 16-row bucket."""
    from llama_npu.cli import main

    d = write_numpy_checkpoint(tmp_path / "m", vocab=501)
    code = main(["run", "--model", str(d), "--device", "emu", "--no-progress", "-n", "2", "--raw", "--prompt", "hello",
                 "--context", "17", "--cache-dir", str(tmp_path / "k")])
    out = capsys.readouterr().out
    assert code == 0 and "stop:" in out, out


@pytest.mark.parametrize("damage,needle", [
    (lambda d: (d / "tokenizer_config.json").write_text("[1, 2]"), "tokenizer_config.json is not a JSON object"),
    (lambda d: (d / "tokenizer_config.json").write_bytes(b"{\"a\": \"\xff\"}"),
     "tokenizer_config.json is not valid JSON (not UTF-8 text)"),
    ("chat_template.json", "chat_template.json: the chat template file is not valid JSON (Expecting property name"),
])
def test_damaged_tokenizer_files(capsys, tmp_path, damage, needle):
    d = write_numpy_checkpoint(tmp_path / "m")
    if damage == "chat_template.json":
        cfg = json.loads((d / "tokenizer_config.json").read_text())
        cfg.pop("chat_template")
        (d / "tokenizer_config.json").write_text(json.dumps(cfg))
        (d / "chat_template.json").write_text("{not json")
    else:
        damage(d)
    code, lines = run_main(capsys, ["run", "--model", str(d), "--prompt", "hello"])
    assert_one_line(code, lines, needle)


def test_prepare_model_checks_the_safetensors_headers(capsys, tmp_path):
    d = write_numpy_checkpoint(tmp_path / "trunc")
    code, lines = run_main(capsys, ["prepare-model", "--model", str(d), "--no-progress"])
    assert code == 0 and not lines
    f = d / "model.safetensors"
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    code, lines = run_main(capsys, ["prepare-model", "--model", str(d), "--no-progress"])
    assert_one_line(code, lines, "truncated safetensors file")
    # a wrong shape in config.json: the header no longer matches
    d2 = write_numpy_checkpoint(tmp_path / "shape", config_overrides={"intermediate_size": 544})
    code, lines = run_main(capsys, ["prepare-model", "--model", str(d2), "--no-progress"])
    assert_one_line(code, lines, "expected [544, 256]")
