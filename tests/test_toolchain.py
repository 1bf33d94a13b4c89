"""Toolchain detection, the one-line ToolchainMissing, device selection and the compile CLI exit code."""
from __future__ import annotations

import re
import stat
import sys
import types
from pathlib import Path

import pytest

from kernel_builder import toolchain as T
from multi_launch_builder.devices import make_device

ROOT = Path(__file__).resolve().parents[1]


def _github_anchors(md: str) -> set[str]:
    out = set()
    for line in md.splitlines():
        m = re.match(r"#+\s+(.*)", line)
        if m:
            a = re.sub(r"[^\w\- ]", "", m[1].strip().lower()).replace(" ", "-")
            out.add(a)
    return out


@pytest.fixture
def bare_env(tmp_path, monkeypatch):
    """No tools on PATH, no Peano, no pyxrt, no NPU: what this machine and CI look like."""
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.delenv("PEANO_INSTALL_DIR", raising=False)
    monkeypatch.delenv("DEVICE", raising=False)
    monkeypatch.setitem(sys.modules, "pyxrt", None)
    monkeypatch.setattr(T, "find_npu", lambda *a, **k: None)
    monkeypatch.setattr(T, "_package_dir", lambda dist, sub: None)
    return tmp_path


def test_npu_without_toolchain_is_one_line_naming_every_piece(bare_env):
    with pytest.raises(T.ToolchainMissing) as ei:
        T.resolve_device_kind("npu")
    msg = str(ei.value)
    assert "\n" not in msg
    for piece in ("aircc", "aiecc", "Peano", "pyxrt", "NPU device"):
        assert piece in msg
    anchors = _github_anchors((ROOT / "docs" / "npu-setup.md").read_text())
    cited = re.findall(r"docs/npu-setup\.md#([\w-]+)", msg)
    assert len(cited) == 5 and set(cited) <= anchors, (cited, anchors)


def test_device_env_npu_and_cli_exit_code(bare_env, monkeypatch, capsys, tiny_model_dir):
    from llama_npu.cli import main
    monkeypatch.setenv("DEVICE", "npu")
    with pytest.raises(T.ToolchainMissing):
        make_device()
    assert main(["compile", "--model", str(tiny_model_dir), "--cache-dir", str(bare_env / "c"), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "docs/npu-setup.md#" in err


def test_auto_falls_back_to_emu_with_one_notice(bare_env, capsys):
    dev = make_device("auto")
    assert dev.name == "emu"
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "using the emu device" in err[0]
    assert make_device("null").name == "null"
    with pytest.raises(ValueError, match="unknown device"):
        make_device("gpu")


def _exe(path: Path, body: str) -> str:
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return str(path)


def test_complete_toolchain_is_detected_and_versioned(bare_env, monkeypatch):
    bin_dir = bare_env / "bin"
    bin_dir.mkdir()
    _exe(bin_dir / "aircc", 'echo "aircc version ${V:-1}"\n')
    _exe(bin_dir / "aiecc", 'echo "aiecc 1.4"\n')
    peano = bare_env / "llvm-aie"
    (peano / "bin").mkdir(parents=True)
    _exe(peano / "bin" / "clang", 'echo "clang version 19 aie"\n')
    monkeypatch.setenv("PATH", str(bin_dir))
    monkeypatch.setenv("PEANO_INSTALL_DIR", str(peano))
    monkeypatch.setitem(sys.modules, "pyxrt", types.ModuleType("pyxrt"))
    monkeypatch.setattr(T, "find_npu", lambda *a, **k: "/dev/accel/accel0 (amdxdna)")
    tc = T.detect()
    assert tc.missing() == [] and tc.aircc == str(bin_dir / "aircc") and tc.peano == str(peano.resolve())
    assert T.resolve_device_kind("auto") == "npu"
    v1 = T.toolchain_versions("npu", tc)
    assert v1["aircc"] == "aircc version 1" and "aie" in v1["peano"]
    monkeypatch.setenv("V", "2")
    assert T.toolchain_versions("npu", tc)["aircc"] == "aircc version 2"
    assert T.toolchain_versions("emu") == {"emu": f"emu-{T.EMU_FORMAT_VERSION}"}


def test_partial_toolchain_lists_only_what_is_missing(bare_env, monkeypatch):
    bin_dir = bare_env / "bin"
    bin_dir.mkdir()
    _exe(bin_dir / "aircc", "echo aircc\n")
    monkeypatch.setenv("PATH", str(bin_dir))
    msg = str(T.Toolchain(aircc="x", peano="/p", pyxrt=True).missing())
    assert msg == "['aiecc', 'npu']"
    with pytest.raises(T.ToolchainMissing) as ei:
        T.detect().require()
    assert "aircc (" not in str(ei.value) and "aiecc (" in str(ei.value)


def test_find_npu_via_xrt_smi(tmp_path):
    smi = _exe(tmp_path / "xrt-smi", 'echo "Device(s) Present"; echo "|[0000:c5:00.1] |NPU Strix |"\n')
    assert T.find_npu(accel_glob=str(tmp_path / "none*"), xrt_smi=smi) == "xrt-smi examine"
    quiet = _exe(tmp_path / "xrt-smi2", 'echo "0 devices found"\n')
    assert T.find_npu(accel_glob=str(tmp_path / "none*"), xrt_smi=quiet) is None


def test_aie_include_found_from_env_or_next_to_aiecc(tmp_path):
    root = tmp_path / "mlir_aie"
    (root / "include" / "aie_api").mkdir(parents=True)
    (root / "bin").mkdir()
    aiecc = root / "bin" / "aiecc"
    aiecc.write_text("#!/bin/sh\n")
    aiecc.chmod(0o755)
    assert T.find_aie_include({"MLIR_AIE_INSTALL_DIR": str(root), "PATH": ""}) == str((root / "include").resolve())
    assert T.find_aie_include({"PATH": ""}, str(aiecc)) == str((root / "include").resolve())
    assert T.find_aie_include({"MLIR_AIE_INSTALL_DIR": str(tmp_path / "nope"), "PATH": ""}) is None
