"""Locating external tools in tests.

On a user's machine a missing `mlir-opt-22` or host C++ compiler skips the test with a stated reason.
CI sets LLAMA_NPU_REQUIRE_TOOLS=1 so such a skip becomes a failure: a green CI cannot hide it.
"""
from __future__ import annotations

import os
import shutil

import pytest

INSTALL_HINTS = {
    "mlir-opt-22": "apt-get install mlir-22-tools",
    "g++": "apt-get install g++",
}


def tools_required() -> bool:
    return os.environ.get("LLAMA_NPU_REQUIRE_TOOLS", "") not in ("", "0", "false", "no")


def require_tool(name: str) -> str:
    """Return the tool's path, or skip (fail under LLAMA_NPU_REQUIRE_TOOLS=1) naming the install command."""
    path = shutil.which(name)
    if path:
        return path
    hint = INSTALL_HINTS.get(name, f"install {name}")
    msg = f"{name} not found on PATH ({hint})"
    if tools_required():
        pytest.fail(msg + " and LLAMA_NPU_REQUIRE_TOOLS=1 forbids skipping", pytrace=False)
    pytest.skip(msg)


def require_module(name: str):
    """Import a Python module, or skip (fail under LLAMA_NPU_REQUIRE_TOOLS=1)."""
    try:
        return __import__(name)
    except ImportError as e:  # pragma: no cover - depends on environment
        msg = f"python module {name} not importable ({e}); pip install 'llama-npu[verify]'"
        if tools_required():
            pytest.fail(msg, pytrace=False)
        pytest.skip(msg, allow_module_level=True)


def assert_lowers(lower: str, tmp_path, name: str, text: str, timeout: int = 1800) -> None:
    """A module `text` (written to tmp_path/<name>.mlir) through the real lowering driver `lower` and the
    hardware model: both must accept it (docs/verification.md, "Real lowering")."""
    from kernel_builder.hw import analyze_module
    from multi_launch_builder.compile.lowering import lower_with_tool

    src = tmp_path / f"{name}.mlir"
    src.write_text(text)
    res = lower_with_tool(lower, src, tmp_path / "out", timeout=timeout)
    rep = analyze_module(text)
    assert rep.ok, rep.first_violation()
    assert res.ok, f"{res.stage}: {res.message}"
