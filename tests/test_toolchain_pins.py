"""The pinned mlir-air / mlir-aie pair (kernel_builder/toolchain_pins.py): `llama-npu doctor` compares the installed
toolchain's commits with it on fake machines (✓ the pinned commit, – none discoverable, ✗ another, advisory, with
the fix), and every commit docs/ cite for mlir-air or mlir-aie is the pinned one or the older pair named as such."""
from __future__ import annotations

import re
from pathlib import Path

from doctor_fakes import healthy
from kernel_builder.toolchain import Toolchain
from kernel_builder.toolchain_pins import BY_PROJECT, OLDER_PAIR, commit_of_version, compare, pin_text
from multi_launch_builder.doctor import FAIL, OK, SKIP, DistInfo, exit_code, render_text, run_checks

ROOT = Path(__file__).resolve().parents[1]
AIR, AIE = BY_PROJECT["mlir-air"].commit, BY_PROJECT["mlir-aie"].commit


def _pins(fm, env: dict | None = None):
    m = fm.machine()
    m.env.update(env or {})
    checks = run_checks(m)
    return {c.id: c for c in checks}["toolchain-pins"], checks


def test_commit_from_wheel_versions_and_comparison():
    assert commit_of_version("0.0.1.2026041305+ae8ed9d") == "ae8ed9d"
    assert commit_of_version("0.0.1.2026050104+efeb41c_no_rtti") == "efeb41c"
    assert commit_of_version("1.2.3") is None and commit_of_version(None) is None
    assert compare("mlir-air", "efeb41c") == compare("mlir-air", AIR) == "match"
    assert compare("mlir-aie", "ec7d2f0bb") == "different" and compare("mlir-aie", None) == "unknown"
    assert compare("mlir-air", "efeb41c-dirty") == "unknown"
    assert pin_text() == "mlir-air efeb41ce4 + mlir-aie ae8ed9d"


def test_wheels_at_the_pinned_commits_pass(tmp_path):
    c, checks = _pins(healthy(tmp_path))
    assert c.status == OK, render_text(checks)
    assert "✓ mlir-air efeb41c (mlir_air 0.0.1.2026050104+efeb41c)" in c.detail
    assert "✓ mlir-aie ae8ed9d (mlir_aie 0.0.1.2026041305+ae8ed9d)" in c.detail
    assert c.data["pinned"] == {"mlir-air": AIR, "mlir-aie": AIE}


def test_another_commit_is_an_advisory_failure_with_the_fix(tmp_path):
    fm = healthy(tmp_path)
    fm.dists["mlir_air"] = DistInfo("mlir_air", "0.0.1.2026030700+ec7d2f0",
                                    fm.dists["mlir_air"].requires)
    c, checks = _pins(fm)
    assert c.status == FAIL and not c.blocking and exit_code(checks) == 0
    assert "✗ mlir-air ec7d2f0 (mlir_air 0.0.1.2026030700+ec7d2f0)" in c.detail and "✓ mlir-aie ae8ed9d" in c.detail
    text = render_text(checks)
    assert f"fix: install mlir-air and mlir-aie built at the pinned commits ({pin_text()})" in text
    assert "docs/npu-setup.md#mlir-air" in text and "advisory" in text


def test_source_build_commit_from_its_git_checkout(tmp_path):
    fm = healthy(tmp_path)
    src = tmp_path / "mlir-air"
    (src / ".git").mkdir(parents=True)
    (src / "install" / "bin").mkdir(parents=True)
    fm.toolchain.aircc = str(src / "install" / "bin" / "aircc")
    del fm.dists["mlir_air"]
    fm.commands[f"git -C {src} rev-parse HEAD"] = AIR + "\n"
    c, _ = _pins(fm)
    assert c.status == OK and f"✓ mlir-air efeb41ce4 (source build {fm.toolchain.aircc})" in c.detail
    fm.commands[f"git -C {src} rev-parse HEAD"] = OLDER_PAIR["mlir-air"] + "\n"
    assert _pins(fm)[0].status == FAIL


def test_unknown_commits_and_nothing_installed(tmp_path):
    fm = healthy(tmp_path)
    fm.dists["mlir_air"] = DistInfo("mlir_air", "0.0.1")
    fm.dists["mlir_aie"] = DistInfo("mlir_aie", "0.0.1")
    c, _ = _pins(fm)
    assert c.status == SKIP and "– mlir-air commit unknown (mlir_air 0.0.1)" in c.detail
    fm.toolchain = Toolchain()
    c, _ = _pins(fm)
    assert c.status == SKIP and c.detail.startswith("no mlir-air/mlir-aie installed and $LLAMA_NPU_AIR_LOWER not set")


def test_lowering_tool_commits_file(tmp_path):
    fm = healthy(tmp_path)
    fm.toolchain = Toolchain()
    tool = tmp_path / "oracle" / "air-lower.sh"
    tool.parent.mkdir()
    tool.write_text("#!/bin/sh\n")
    c, _ = _pins(fm, {"LLAMA_NPU_AIR_LOWER": str(tool)})
    assert c.status == SKIP and c.detail.count("commit unknown ($LLAMA_NPU_AIR_LOWER)") == 2
    (tool.parent / "COMMITS").write_text(f"mlir-air {AIR}\nmlir-aie {AIE}\n")
    c, _ = _pins(fm, {"LLAMA_NPU_AIR_LOWER": str(tool)})
    assert c.status == OK and "✓ mlir-air efeb41ce4 ($LLAMA_NPU_AIR_LOWER)" in c.detail
    (tool.parent / "COMMITS").write_text(f"mlir-air {OLDER_PAIR['mlir-air']}\nmlir-aie {OLDER_PAIR['mlir-aie']}\n")
    c, _ = _pins(fm, {"LLAMA_NPU_AIR_LOWER": str(tool)})
    assert c.status == FAIL and "✗ mlir-aie c5d4befdc ($LLAMA_NPU_AIR_LOWER)" in c.detail


def test_docs_cite_only_the_pinned_commits():
    """A commit of mlir-air / mlir-aie named in docs/ (7+ hex digits within a few words of the project name) is a
    prefix of the pin, or of the older pair, which docs may name only as the pair that does not work."""
    known = {BY_PROJECT[p].commit for p in BY_PROJECT} | set(OLDER_PAIR.values())
    cited = 0
    for doc in sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md"]:
        text = doc.read_text()
        for m in re.finditer(r"mlir-ai[er][^.\n]{0,40}?`?\b([0-9a-f]{7,40})\b", text):
            h = m[1]
            if not re.search(r"[a-f]", h) or not re.search(r"[0-9]", h):
                continue                                  # a decimal number or a word, not a hash
            cited += 1
            assert any(k.startswith(h) for k in known), f"{doc.name}: {m[0]!r} is not a pinned commit"
    assert cited >= 3
    assert "kernel_builder/toolchain_pins.py" in (ROOT / "docs" / "verification.md").read_text()
