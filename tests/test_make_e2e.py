"""Every make target and CLI verb, end to end on the embedded model on emu, so none can rot unnoticed
(`make verify` runs in tests/test_make_targets.py, `make help` there too; `make test` is this suite).
Small N_TOKENS and the quick benchmarks keep this module to a few minutes."""
from __future__ import annotations

import json
import os
import queue
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
VENV_BIN = ROOT / ".venv" / "bin"
pytestmark = pytest.mark.skipif(
    not (VENV_BIN / "python").exists() or Path(sys.prefix).resolve() != (ROOT / ".venv").resolve()
    or not shutil.which("make"), reason="runs through the project's .venv and make (make test / CI)")

HOSTILE = 'Say "hi" `touch {marker}` $HOME $(shell touch {marker}) \'q\' \\n\nline two: naïve 東京 ✓ <|im_end|>'


def make(*args: str, timeout: float = 600, stdin: str | None = None, **env: str) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if k not in ("MODEL", "PROMPT", "BUCKETS", "LLAMA_NPU_PROMPT")}
    full.update({"DEVICE": "emu", **env})
    p = subprocess.run([shutil.which("make"), "-s", *args], cwd=ROOT, capture_output=True, text=True, env=full,
                       timeout=timeout, input=stdin if stdin is not None else "")
    assert "Traceback" not in p.stdout + p.stderr, (p.stdout + p.stderr)[-4000:]
    return p


def _ok(p: subprocess.CompletedProcess) -> str:
    out = p.stdout + p.stderr
    assert p.returncode == 0, out[-4000:]
    return out


def test_make_run_passes_the_prompt_verbatim(tmp_path):
    marker = tmp_path / "executed"
    prompt = HOSTILE.format(marker=marker)
    # MODEL with quotes, a backtick and $: the embedded model's files linked into such a directory
    from llama_npu.model_source import resolve_model

    model = tmp_path / "we'ird \"m\" `touch model-quoting-failed` $HOME"   # run in ROOT, if it ever ran
    model.mkdir()
    for f in resolve_model(None, progress=False).iterdir():
        (model / f.name).symlink_to(f)
    out = _ok(make("run", "DRY_RUN=1", f"PROMPT={prompt}", f"MODEL={model}"))
    line = next(ln for ln in out.splitlines() if ln.startswith("prompt ("))
    assert json.loads(line.split(": ", 1)[1]) == prompt
    assert f"model {model}, buckets" in out
    assert not marker.exists() and not (ROOT / "model-quoting-failed").exists()
    # the real run: the same text generates (the forged end-of-turn stays text)
    out = _ok(make("run", "N_TOKENS=2", f"PROMPT={prompt}"))
    assert re.search(r"\| 2 tokens, stop: length", out) and not marker.exists(), out[-2000:]


def test_make_profile_prints_its_tables():
    out = _ok(make("profile", "N_TOKENS=3", "PROMPT=What is the capital of France?"))
    assert re.search(r"== prefill \(\d+ tokens, bucket 64\) ==", out), out[-3000:]
    assert "== decode (2 tokens) ==" in out
    assert out.count("module ") >= 2 and re.search(r"^total\s+\d+", out, re.M)
    assert re.search(r"^layer_kv\d+\s+\d+", out, re.M) and "dispatches/token" in out
    assert re.search(r"TTFT [\d.]+ ms", out)


def test_make_compile_reports_every_module():
    out = _ok(make("compile"))
    assert "buckets [64, 256, 1024, 2048]" in out and re.search(r"layer_kv\d+", out)
    assert "the runtime keeps at most 8 loaded" in out


def test_make_chat_scripted():
    p = make("chat", "N_TOKENS=2", stdin="What is 2 plus 2?\n/clear\nhello\n/quit\n")
    out = _ok(p)
    assert len(re.findall(r"-token prompt\)", p.stderr)) == 2 and "(conversation cleared)" in p.stderr, out[-3000:]


def test_make_doctor():
    p = make("doctor")   # exit 0 when the NPU path can work, 1 otherwise (make reports that as 2)
    assert p.returncode in (0, 2), (p.stdout + p.stderr)[-3000:]
    assert re.search(r"^\s*[✓✗–] ", p.stdout, re.M), p.stdout


def test_cli_launcher_hw_check_and_prepare_model(tmp_path):
    """README's CLI line: .venv/bin/llama-npu works as written."""
    from multi_launch_builder.stitcher import stitch
    from llama_npu.models.llama import SMOLLM2_135M, LlamaModel

    f = tmp_path / "lm_head.mlir"
    f.write_text(stitch(LlamaModel(SMOLLM2_135M).head().decls[0]))
    cli = str(VENV_BIN / "llama-npu")
    p = subprocess.run([cli, "hw-check", str(f)], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0 and "lm_head" in p.stdout, p.stdout + p.stderr
    p = subprocess.run([cli, "prepare-model", "--no-progress"], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0 and p.stdout.startswith("model ready: "), p.stdout + p.stderr


def test_make_bench_quick():
    out = _ok(make("bench", "QUICK=1", timeout=1200))
    for needle in ("[bench] generate+stitch", "[bench] embedded model on emu: TTFT", "null device",
                   "peak host RSS", "concurrent clients", "NPU2 cost model", "TTFT 100-token prompt",
                   "2-turn chat", "100-token prefill", "decode at position ~100", "KV8 (", "bf16 KV "):
        assert needle in out, (needle, out[-3000:])


def test_make_bench_serve_quick():
    out = _ok(make("bench-serve", "QUICK=1", timeout=900))
    assert re.search(r"2 concurrent clients: [\d.]+ requests/min", out), out[-3000:]


def test_make_diagnosis(hf_checkpoint, tmp_path):
    """On a tiny random HF checkpoint (the embedded model's reference costs a minute; `make verify` runs it)."""
    model = hf_checkpoint(hidden=256, n_heads=4, n_kv_heads=2, head_dim=64, ffn=512, n_layers=2, vocab=512)
    out = _ok(make("diagnosis", f"MODEL={model}", "PROMPT=hello `touch x` $HOME world", timeout=900))
    assert "[diagnosis] lowest cosine" in out, out[-3000:]


def test_make_clean_keeps_models(tmp_path):
    cache = tmp_path / "cache"
    for d in (cache / "kernels" / "ab", cache / "models" / "m", tmp_path / "build" / "x", tmp_path / "pkg" / "__pycache__"):
        d.mkdir(parents=True)
    p = subprocess.run([shutil.which("make"), "-s", "-f", str(ROOT / "Makefile"), "-C", str(tmp_path), "clean"],
                       capture_output=True, text=True, timeout=60, env=dict(os.environ, LLAMA_NPU_CACHE=str(cache)))
    assert p.returncode == 0, p.stderr
    assert not (cache / "kernels").exists() and (cache / "models" / "m").is_dir()
    assert not (tmp_path / "build").exists() and not (tmp_path / "pkg" / "__pycache__").exists()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_make_serve_answers_one_request():
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("MODEL", "BUCKETS")}
    proc = subprocess.Popen([shutil.which("make"), "-s", "serve", "DEVICE=emu", "HOST=127.0.0.1", f"PORT={port}",
                             "BUCKETS=64"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env, start_new_session=True)
    lines: queue.Queue = queue.Queue()
    reader = threading.Thread(target=lambda: [lines.put(ln) for ln in proc.stdout], daemon=True)
    reader.start()
    seen = []
    try:
        while True:
            ln = lines.get(timeout=300)
            seen.append(ln)
            if ln.startswith("llama-npu serve: http://"):
                break
        model = re.search(rf"http://127.0.0.1:{port}/v1 \(model (\S+)\)", ln).group(1)
        body = json.dumps({"model": model, "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 2,
                           "temperature": 0}).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", data=body,
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=120) as r:
            reply = json.loads(r.read())
        assert reply["usage"]["completion_tokens"] == 2 and reply["choices"][0]["finish_reason"] == "length"
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    reader.join(timeout=30)   # the rest of the output, up to EOF
    while not lines.empty():
        seen.append(lines.get())
    # make re-raises the Ctrl-C it forwarded (-SIGINT) after serve stopped cleanly
    assert proc.returncode in (0, 130, -signal.SIGINT), "".join(seen)
    assert any("llama-npu serve: stopped" in ln for ln in seen), "".join(seen)
