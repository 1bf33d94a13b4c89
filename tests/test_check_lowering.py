"""`llama-npu check-lowering` with fake lowering tools (scripts with the `$LLAMA_NPU_AIR_LOWER` interface that print
`OK ...` or `FAIL <stage>/<pass>: ...`) and with none: one table row per stitched module, exit 0 only when every
module lowers, 2 with one line naming what is missing when nothing can lower. The real tool's runs are the
skip-if-absent tests/test_air_lower_*.py."""
from __future__ import annotations

import re
import stat
from pathlib import Path

import pytest

from kernel_builder.toolchain import Toolchain
from llama_npu.cli import main
from multi_launch_builder.compile.lowering import (AirccLowerer, LoweringUnavailable, ToolLowerer, find_lowerer,
                                                   parse_result)

ARGS = ["--buckets", "64", "--context", "256", "--no-progress"]
FAKE = """#!/bin/sh
# $LLAMA_NPU_AIR_LOWER interface: --whole -q [aircc options] MODULE.mlir OUTDIR
[ "$1" = --whole ] && [ "$2" = -q ] || { echo "FAIL args/usage: expected --whole -q first, got $1 $2"; exit 2; }
eval src=\\${$(($#-1))}
grep -q '^// aircc preset:' "$src" || { echo "FAIL parse/header: no aircc preset line in $src"; exit 1; }
echo "lowering $src"
case "$(basename "$src")" in
  {fail}) echo "FAIL airtoaie/air-to-aie: 'air.channel.put' op failed to specialize channel bundle indices"; exit 1;;
esac
echo "OK $(basename "$src") lowered"
"""


def _tool(tmp_path: Path, fail_glob: str = "__none__", body: str | None = None) -> str:
    p = tmp_path / "fake-air-lower.sh"
    p.write_text(body if body is not None else FAKE.replace("{fail}", fail_glob))
    p.chmod(p.stat().st_mode | stat.S_IXUSR)
    return str(p)


@pytest.fixture(scope="module")
def config_dir(tmp_path_factory):
    from benchmarks.null_device import write_sparse_checkpoint
    from llama_npu.models.llama import ModelShapes

    shapes = ModelShapes(hidden=256, n_heads=4, n_kv_heads=2, head_dim=64, ffn=512, vocab=512, n_layers=1,
                         rms_eps=1e-5)
    return str(write_sparse_checkpoint(tmp_path_factory.mktemp("cfg") / "tiny", shapes, Path("/nonexistent")))


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    """Verdicts of these fake tools are kept in the test's own cache, not the user's."""
    monkeypatch.setenv("LLAMA_NPU_CACHE", str(tmp_path / "cache"))


def _rows(out: str) -> dict[str, list[str]]:
    lines = out.splitlines()
    i = next(k for k, ln in enumerate(lines) if ln.startswith("module "))
    rows = {}
    for ln in lines[i + 2:]:
        if re.match(r"^\d+/\d+ modules lower", ln):
            break
        cells = ln.split()
        rows[cells[0]] = cells[1:]
    return rows


def test_every_module_lowers_with_an_ok_tool(tmp_path, config_dir, capsys, monkeypatch):
    monkeypatch.setenv("LLAMA_NPU_AIR_LOWER", _tool(tmp_path))
    monkeypatch.setattr("multi_launch_builder.compile.lowering.detect", lambda env: Toolchain())  # none installed
    assert main(["check-lowering", "--model", config_dir, *ARGS]) == 0
    out = capsys.readouterr().out
    rows = _rows(out)
    # both decode-attention placements: the fused decode layer and the host-attention fallback's modules
    assert {"layer_kv256", "qkv_dec", "lm_head", "token_kv256"} <= set(rows), out   # + the one-module decode token
    assert all(r[1] == "OK" and r[2] == "-" and int(r[0]) >= 1 for r in rows.values()), out
    assert f"{len(rows)}/{len(rows)} modules lower" in out
    assert "pinned mlir-air efeb41ce4 + mlir-aie ae8ed9d" in out and "$LLAMA_NPU_AIR_LOWER; built from commits unknown" in out


def test_the_tools_commits_are_shown_against_the_pin(tmp_path):
    from kernel_builder.toolchain_pins import BY_PROJECT, OLDER_PAIR
    tool = _tool(tmp_path)
    (tmp_path / "COMMITS").write_text(f"mlir-air {BY_PROJECT['mlir-air'].commit}\nmlir-aie {OLDER_PAIR['mlir-aie']}\n")
    assert ToolLowerer(tool).describe().endswith(
        "built from mlir-air efeb41ce4 (match), mlir-aie c5d4befdc (different))")


def test_a_failing_module_gets_its_stage_and_exit_1(tmp_path, config_dir, capsys):
    tool = _tool(tmp_path, fail_glob="lm_head.mlir")
    assert main(["check-lowering", "--model", config_dir, "--tool", tool, *ARGS]) == 1
    out = capsys.readouterr().out
    rows = _rows(out)
    assert rows["lm_head"][1:3] == ["FAIL", "airtoaie/air-to-aie"], out
    assert sum(r[1] == "FAIL" for r in rows.values()) == 1
    assert f"{len(rows) - 1}/{len(rows)} modules lower" in out
    assert "FAILED lm_head: airtoaie/air-to-aie: 'air.channel.put' op failed to specialize" in out


def test_only_and_a_tool_that_gives_no_verdict(tmp_path, config_dir, capsys):
    tool = _tool(tmp_path, body="#!/bin/sh\necho 'Segmentation fault' >&2\nexit 139\n")
    assert main(["check-lowering", "--model", config_dir, "--tool", tool, "--only", "lm_head", *ARGS]) == 1
    out = capsys.readouterr().out
    assert list(_rows(out)) == ["lm_head"]
    assert "FAILED lm_head: ?: exit 139, no OK/FAIL line; stderr: Segmentation fault" in out
    assert main(["check-lowering", "--model", config_dir, "--tool", tool, "--only", "nope", *ARGS]) == 2
    assert "--only names unknown modules ['nope']" in capsys.readouterr().err


def test_without_any_lowering_one_line_and_exit_2(tmp_path, config_dir, capsys, monkeypatch):
    monkeypatch.delenv("LLAMA_NPU_AIR_LOWER", raising=False)
    monkeypatch.setattr("multi_launch_builder.compile.lowering.detect", lambda env: Toolchain())
    assert main(["check-lowering", "--model", config_dir, *ARGS]) == 2
    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()
    assert len(err) == 1 and captured.out == "", captured
    assert "aircc, aiecc, Peano not installed and $LLAMA_NPU_AIR_LOWER not set" in err[0]
    assert "docs/verification.md#real-lowering" in err[0] and "docs/npu-setup.md#mlir-air" in err[0]
    monkeypatch.setenv("LLAMA_NPU_AIR_LOWER", str(tmp_path / "missing.sh"))
    assert main(["check-lowering", "--model", config_dir, *ARGS]) == 2
    assert "names " + str(tmp_path / "missing.sh") + ", which is not an executable file" in capsys.readouterr().err


def test_lowerer_choice(tmp_path):
    tool = _tool(tmp_path)
    full = Toolchain(aircc="/x/aircc", aiecc="/x/aiecc", peano="/x/peano")
    assert isinstance(find_lowerer({"LLAMA_NPU_AIR_LOWER": tool}, full), AirccLowerer)   # installed first
    assert isinstance(find_lowerer({"LLAMA_NPU_AIR_LOWER": tool}, Toolchain(aircc="/x/aircc")), ToolLowerer)
    assert find_lowerer({}, full, tool=tool).tool == tool                                  # --tool wins
    with pytest.raises(LoweringUnavailable, match="^no lowering toolchain: aiecc, Peano not installed"):
        find_lowerer({}, Toolchain(aircc="/x/aircc"))


def test_parse_result():
    assert parse_result("x\nOK lowered\n\n", 0).ok
    assert not parse_result("OK lowered\n", 1).ok                # an OK line with a failing exit is no OK
    r = parse_result("FAIL aiecc/aie-assign-buffer-addresses: 'aie.tile' op allocated buffers exceeded\n", 1)
    assert (r.ok, r.stage) == (False, "aiecc/aie-assign-buffer-addresses")
    assert r.message.startswith("'aie.tile' op allocated buffers exceeded")


def test_installed_aircc_path_with_a_fake_aircc(tmp_path, config_dir, capsys):
    """The installed-toolchain lowerer: aircc --device npu2 --output-format none -i <insts> with the module's
    preset flags; a run that writes the instructions is OK, a non-zero exit is FAIL at aircc with its first
    error line."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    aircc = bin_dir / "aircc"
    aircc.write_text("#!/bin/sh\necho \"$@\" > args.txt\n"
                     "case \"$*\" in *--stack-size*) echo 'error: stack too large' >&2; exit 1;; esac\n"
                     "while [ $# -gt 0 ]; do [ \"$1\" = -i ] && echo INSTS > \"$2\"; shift; done\n")
    aircc.chmod(0o755)
    (bin_dir / "aiecc").write_text("#!/bin/sh\n")
    (bin_dir / "aiecc").chmod(0o755)
    low = AirccLowerer(Toolchain(aircc=str(aircc), aiecc=str(bin_dir / "aiecc"), peano=str(tmp_path)))
    plain = "// llama-npu module\n// aircc preset: \nmodule {\n}\n"
    res = low.lower("m", plain, tmp_path)
    assert res.ok and res.message.startswith("OK 6 bytes"), res
    args = (tmp_path / "args.txt").read_text().split()
    assert args[1:5] == ["--device", "npu2", "--output-format", "none"] and args[5] == "-i"
    res = low.lower("m2", plain.replace("preset: ", "preset: --stack-size 1280"), tmp_path)
    assert (res.ok, res.stage) == (False, "aircc") and res.message == "exit 1: error: stack too large"


def test_verdicts_are_kept_per_text_and_tool(tmp_path, config_dir, capsys, monkeypatch):
    """A second check of unchanged modules lowers nothing (rows say `memo`); a crash is not kept; --no-memo and a
    rebuilt tool lower again."""
    monkeypatch.setenv("LLAMA_NPU_CACHE", str(tmp_path / "cache"))
    calls = tmp_path / "calls"
    body = FAKE.replace("{fail}", "__none__").replace('echo "lowering $src"', f'echo x >> {calls}')
    tool = _tool(tmp_path, body=body)
    only = ["--only", "lm_head", "--only", "layer_kv256"]
    assert main(["check-lowering", "--model", config_dir, "--tool", tool, *only, *ARGS]) == 0
    first = capsys.readouterr().out
    assert len(calls.read_text().split()) == 2 and "memo" not in first
    assert main(["check-lowering", "--model", config_dir, "--tool", tool, *only, *ARGS]) == 0
    out = capsys.readouterr().out
    assert len(calls.read_text().split()) == 2, "unchanged modules were lowered again"
    assert all(r[-1] == "memo" for r in _rows(out).values()) and "2 verdicts from earlier runs" in out
    assert main(["check-lowering", "--model", config_dir, "--tool", tool, *only, "--no-memo", *ARGS]) == 0
    assert len(calls.read_text().split()) == 4
    capsys.readouterr()
    Path(tool).write_text(body + "\n# rebuilt\n")   # another tool build: its verdicts are its own
    assert main(["check-lowering", "--model", config_dir, "--tool", tool, *only, *ARGS]) == 0
    assert len(calls.read_text().split()) == 6
    crash = _tool(tmp_path, body=f"#!/bin/sh\necho x >> {calls}\nexit 139\n")
    for _ in range(2):
        assert main(["check-lowering", "--model", config_dir, "--tool", crash, "--only", "lm_head", *ARGS]) == 1
    assert len(calls.read_text().split()) == 8, "a run without a verdict was kept"


def test_token_modules_are_probed_at_two_layers_unless_full_depth(tmp_path, capsys):
    """A deeper model's one-dispatch token module is lowered as the model cut to 2 layers (row `<name>@2L`, fewer
    launches); --full-depth lowers the module the engine runs."""
    from benchmarks.null_device import write_sparse_checkpoint
    from llama_npu.models.llama import ModelShapes

    shapes = ModelShapes(hidden=256, n_heads=4, n_kv_heads=2, head_dim=64, ffn=512, vocab=512, n_layers=4,
                         rms_eps=1e-5)
    cfg = str(write_sparse_checkpoint(tmp_path / "deep", shapes, Path("/nonexistent")))
    tool = _tool(tmp_path)
    assert main(["check-lowering", "--model", cfg, "--tool", tool, "--only", "token_kv256@2L", *ARGS]) == 0
    probe = _rows(capsys.readouterr().out)["token_kv256@2L"]
    assert main(["check-lowering", "--model", cfg, "--tool", tool, "--full-depth", "--only", "token_kv256", *ARGS]) == 0
    full = _rows(capsys.readouterr().out)["token_kv256"]
    assert probe[1] == full[1] == "OK" and 0 < int(probe[0]) < int(full[0]), (probe, full)
