"""The Makefile is the user interface: `make help` documents every target, and `make verify` passes on the
embedded model (this is the one `make verify` the CI run includes)."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TARGETS = ["setup", "compile", "check-lowering", "run", "chat", "serve", "profile", "verify", "verify-full", "diagnosis", "bench",
           "bench-serve", "doctor", "test", "clean", "help"]


def _make() -> str:
    make = shutil.which("make")
    if not make:
        pytest.skip("make not installed")
    return make


def test_make_help_lists_every_target_once():
    out = subprocess.run([_make(), "-s", "help"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    for target in TARGETS:
        lines = [ln for ln in out.splitlines() if re.match(rf"\s*make {re.escape(target)}\s", ln)]
        assert len(lines) == 1, f"`make help` should list `{target}` exactly once:\n{out}"
        assert len(lines[0].split(None, 2)) == 3, f"`{target}` has no description: {lines[0]!r}"


def test_help_is_the_default_target():
    out = subprocess.run([_make(), "-s"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert "make verify" in out and "make run" in out


@pytest.mark.parametrize("target", ["verify", "verify-full"])
def test_verify_targets_pass_the_weights_and_kv(target):
    """`make verify-full WEIGHTS=bfp16` gates the block-float run, not silently the bf16 one (make -n: the command)."""
    out = subprocess.run([_make(), "-n", target, "WEIGHTS=bfp16", "KV=int8", "DEVICE=emu"], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout
    line = next(ln for ln in out.splitlines() if "-m verify verify" in ln)
    assert "--weights 'bfp16'" in line and "--kv 'int8'" in line and "--device 'emu'" in line, line


@pytest.mark.skipif(not (ROOT / ".venv" / "bin" / "python").exists() or
                    Path(sys.prefix).resolve() != (ROOT / ".venv").resolve(),
                    reason="runs through the project's .venv (make test / CI)")
def test_make_verify_passes_on_the_embedded_model():
    env = dict(os.environ, DEVICE="emu")
    proc = subprocess.run([_make(), "verify"], cwd=ROOT, capture_output=True, text=True, env=env, timeout=3000)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert "[verify] PASS" in out, out[-4000:]


def test_pyproject_has_no_setuptools_warnings():
    """The license as an SPDX string and packages found (data folders as namespace packages): setuptools reads the
    project table without a deprecation warning, and every package and data folder is found."""
    import warnings

    setuptools = pytest.importorskip("setuptools")
    from setuptools.config.pyprojecttoml import apply_configuration
    from setuptools.dist import Distribution

    if int(setuptools.__version__.split(".")[0]) < 77:
        pytest.skip("SPDX license strings need setuptools >= 77 (the build requires it)")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dist = apply_configuration(Distribution(), ROOT / "pyproject.toml")
    assert not [str(w.message) for w in caught]
    for pkg in ("llama_npu", "llama_npu.models", "kernel_builder.hw", "multi_launch_builder", "external_kernels",
                "external_kernels.host", "verify"):
        assert pkg in dist.packages, (pkg, dist.packages)
    assert not [p for p in dist.packages if p.startswith(("tests", "benchmarks"))]


def test_readme_cli_line_names_the_venv_launcher():
    text = (ROOT / "README.md").read_text()
    assert ".venv/bin/llama-npu run --prompt" in text
    scripts = re.search(r'\[project.scripts\]\s*\nllama-npu = "llama_npu.cli:main"', (ROOT / "pyproject.toml").read_text())
    assert scripts, "make setup installs .venv/bin/llama-npu from [project.scripts]"
