"""Build driver: content-hash keys, manifest, atomic writes, locks, the npu command line."""
from __future__ import annotations

import json
import multiprocessing as mp
import os
import stat
import textwrap
from pathlib import Path

import pytest

from multi_launch_builder import compile as B
from multi_launch_builder.compile import driver
from multi_launch_builder.compile.store import sha256_file
from kernel_builder.toolchain import Toolchain
from tests.small_decls import add_norm, gemv_mod


def _status(report):
    return {r.name: r.status for r in report.results}


def _build(cache, decls, **kw):
    return B.build_modules(decls, cache, "emu", progress=False, **kw)


def test_second_build_skips_and_artifact_is_the_stitched_text(tmp_path):
    decls = [add_norm(), gemv_mod()]
    rep = _build(tmp_path, decls)
    assert _status(rep) == {"add_norm": "built", "lm_head_gemv_t": "built"}
    text = rep.artifacts["add_norm"].mlir.read_text()
    assert "air.launch" in text and 'kind = "rmsnorm"' in text and "func.func @add_norm(" in text
    assert set(rep.results[0].times) >= {"generate", "stitch"}
    rep2 = _build(tmp_path, decls)
    assert _status(rep2) == {"add_norm": "skipped", "lm_head_gemv_t": "skipped"}
    assert rep2.artifacts["add_norm"].mlir == rep.artifacts["add_norm"].mlir
    assert "skipped" in rep2.table() and "0 built, 2 up to date" in rep2.table()
    assert _status(_build(tmp_path, decls, force=True)) == {"add_norm": "built", "lm_head_gemv_t": "built"}


def test_null_shares_the_emu_artifacts(tmp_path):
    _build(tmp_path, [add_norm()])
    rep = B.build_modules([add_norm()], tmp_path, "null", progress=False)
    assert _status(rep) == {"add_norm": "skipped"}


def test_corrupt_manifest_rebuilds(tmp_path):
    decls = [add_norm()]
    _build(tmp_path, decls)
    (tmp_path / B.MANIFEST).write_text("{ not json")
    with pytest.raises(B.BuildError, match="not built"):
        B.load_artifacts(tmp_path, "emu", decls)
    assert _status(_build(tmp_path, decls)) == {"add_norm": "built"}
    json.loads((tmp_path / B.MANIFEST).read_text())


def test_damaged_artifact_is_never_loaded_and_rebuilds(tmp_path):
    decls = [add_norm()]
    art = _build(tmp_path, decls).artifacts["add_norm"]
    art.mlir.write_text(art.mlir.read_text()[:100])           # truncated file, same name
    with pytest.raises(B.BuildError, match="stale or damaged"):
        B.load_artifacts(tmp_path, "emu", decls)
    assert _status(_build(tmp_path, decls)) == {"add_norm": "built"}
    assert B.load_artifacts(tmp_path, "emu", decls)["add_norm"].mlir.read_text().endswith("}\n")


def test_toolchain_version_change_rebuilds(tmp_path, monkeypatch):
    decls = [add_norm(), gemv_mod()]
    _build(tmp_path, decls)
    monkeypatch.setattr(driver, "toolchain_versions", lambda kind, tc=None: {"emu": "emu-999"})
    assert _status(_build(tmp_path, decls)) == {"add_norm": "built", "lm_head_gemv_t": "built"}


def test_builder_text_change_rebuilds_exactly_that_module(tmp_path):
    _build(tmp_path, [add_norm(), gemv_mod()])
    changed = [add_norm(eps=1e-6), gemv_mod()]                # the rmsnorm builder now emits another eps
    with pytest.raises(B.BuildError, match="add_norm: stale"):
        B.load_artifacts(tmp_path, "emu", changed)            # never a stale load
    assert _status(_build(tmp_path, changed)) == {"add_norm": "built", "lm_head_gemv_t": "skipped"}
    # the superseded key dir stays (another process may still load it lazily) ...
    assert len(list((tmp_path / "emu" / "add_norm").iterdir())) == 2


def test_superseded_artifacts_are_pruned_beyond_the_newest_few(tmp_path):
    """A process that resolved an older key can still load it after a rebuild; only KEEP_SUPERSEDED older key
    directories per module are kept, so the cache does not grow without bound."""
    art = _build(tmp_path, [add_norm()]).artifacts["add_norm"]
    for i in range(driver.KEEP_SUPERSEDED + 2):
        _build(tmp_path, [add_norm(eps=1e-6 * (i + 2))])
    assert art.mlir.exists() is False                         # the oldest was pruned
    assert len(list((tmp_path / "emu" / "add_norm").iterdir())) == driver.KEEP_SUPERSEDED + 1
    latest = _build(tmp_path, [add_norm(eps=1e-6 * 2)]).artifacts["add_norm"]   # an older key is rebuilt or kept
    assert latest.mlir.exists()


def test_external_kernel_is_part_of_the_key(tmp_path):
    text = _build(tmp_path, [gemv_mod()]).artifacts["lm_head_gemv_t"].mlir.read_text()
    refs = B.externals_for_text(text)
    assert [r.obj for r in refs] == ["mv_k64_c64_m4_r4.o"] and refs[0].kernel is not None
    k1 = B.module_key(text, refs, "emu", {"emu": "x"}, [])
    other = [B.ExternalRef(refs[0].obj, refs[0].kernel, "0" * 64)]
    assert B.module_key(text, other, "emu", {"emu": "x"}, []) != k1


def test_interrupted_artifact_move_leaves_nothing_loadable(tmp_path, monkeypatch):
    decls = [add_norm()]
    real = os.replace

    def crash(src, dst):
        raise OSError("simulated crash during the artifact move")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(B.BuildError, match="add_norm: .*simulated crash"):
        _build(tmp_path, decls)
    monkeypatch.setattr(os, "replace", real)
    with pytest.raises(B.BuildError, match="not built"):
        B.load_artifacts(tmp_path, "emu", decls)
    assert not list((tmp_path / ".tmp").iterdir())          # staging cleaned up
    assert _status(_build(tmp_path, decls)) == {"add_norm": "built"}


def test_interrupted_manifest_write_rebuilds(tmp_path, monkeypatch):
    decls = [add_norm()]
    real = os.replace

    def crash_on_manifest(src, dst):
        if Path(dst).name == B.MANIFEST:
            raise OSError("simulated crash during the manifest write")
        return real(src, dst)

    monkeypatch.setattr(os, "replace", crash_on_manifest)
    with pytest.raises(B.BuildError):
        _build(tmp_path, decls)
    monkeypatch.setattr(os, "replace", real)
    assert not list(tmp_path.glob(".manifest.json.*"))              # no partial manifest left
    assert _status(_build(tmp_path, decls)) == {"add_norm": "built"}


def _killed_build(cache: str) -> None:
    """Child: dies hard (no cleanup, like SIGKILL) in the middle of storing the artifact."""
    os.replace = lambda src, dst: os._exit(17)
    B.build_modules([add_norm()], Path(cache), "emu", progress=False)


def test_killed_process_mid_write_leaves_no_loadable_artifact(tmp_path):
    p = mp.get_context("fork").Process(target=_killed_build, args=(str(tmp_path),))
    p.start()
    p.join(60)
    assert p.exitcode == 17
    with pytest.raises(B.BuildError, match="not built"):
        B.load_artifacts(tmp_path, "emu", [add_norm()])
    assert _status(_build(tmp_path, [add_norm()])) == {"add_norm": "built"}


def _concurrent_build(cache: str, q) -> None:
    rep = B.build_modules([add_norm(), gemv_mod()], Path(cache), "emu", progress=False)
    q.put({n: (a.meta["key"], a.mlir.read_text()) for n, a in rep.artifacts.items()})


def test_two_concurrent_compiles_into_one_dir(tmp_path):
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    procs = [ctx.Process(target=_concurrent_build, args=(str(tmp_path), q)) for _ in range(2)]
    for p in procs:
        p.start()
    results = [q.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    assert results[0] == results[1]
    loaded = B.load_artifacts(tmp_path, "emu", [add_norm(), gemv_mod()])
    assert {n: a.mlir.read_text() for n, a in loaded.items()} == {n: t for n, (k, t) in results[0].items()}


def test_mlir_check_failure_fails_the_module(tmp_path):
    from tests.tooling import require_tool
    require_tool("mlir-opt-22")
    import dataclasses
    good = add_norm()
    import re
    # the add herd's first-offset product typed i64 while its operands are index: mlir-opt rejects the herd body
    bad_launch = dataclasses.replace(
        good.launches[0], build=lambda: re.sub(r"(= arith\.muli %tx, %\w+ : )index", r"\1i64",
                                               good.launches[0].build(), count=1))
    bad = dataclasses.replace(good, launches=(bad_launch, good.launches[1]))
    rep = B.build_modules([bad], tmp_path, "emu", progress=False, raise_on_error=False)
    assert _status(rep) == {"add_norm": "failed"} and "mlir-opt-22 rejected" in rep.results[0].error


# ---------------------------------------------------------------- npu path with stand-in tools

def _script(path: Path, body: str) -> str:
    path.write_text("#!/bin/sh\n" + textwrap.dedent(body))
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return str(path)


@pytest.fixture
def fake_npu_toolchain(tmp_path):
    bin_dir = tmp_path / "bin"
    peano = tmp_path / "peano"
    (peano / "bin").mkdir(parents=True)
    bin_dir.mkdir()
    calls = tmp_path / "calls.txt"
    # clang++ stand-in: create the -o file
    _script(peano / "bin" / "clang++", f"""
        echo "peano $@" >> {calls}
        while [ $# -gt 0 ]; do if [ "$1" = "-o" ]; then touch "$2"; fi; shift; done
        """)
    _script(peano / "bin" / "clang", "echo 'clang version 19.0.0 (llvm-aie)'\n")
    aircc = _script(bin_dir / "aircc", f"""
        if [ "$1" = "--version" ]; then echo "aircc ${{AIRCC_FAKE_VERSION:-1.0}}"; exit 0; fi
        echo "aircc $@" >> {calls}
        echo "running in $(pwd)"
        if [ -n "$AIRCC_FAKE_FAIL" ]; then echo "error: placement failed" >&2; exit 3; fi
        while [ $# -gt 0 ]; do if [ "$1" = "--elf-name" ]; then echo ELF > "$2"; fi; shift; done
        """)
    aiecc = _script(bin_dir / "aiecc", "echo aiecc 1.4.0\n")
    include = tmp_path / "mlir_aie" / "include"
    (include / "aie_api").mkdir(parents=True)
    return Toolchain(aircc=aircc, aiecc=aiecc, peano=str(peano), pyxrt=True, npu="stand-in",
                     aie_include=str(include)), calls


def test_npu_build_runs_peano_then_aircc_with_real_flags(tmp_path, fake_npu_toolchain):
    tc, calls = fake_npu_toolchain
    cache = tmp_path / "cache"
    rep = B.build_modules([gemv_mod("lm_head_gemv_s1")], cache, "npu", progress=False, toolchain=tc)
    art = rep.artifacts["lm_head_gemv_s1"]
    assert art.binary.name == "lm_head_gemv_s1.elf" and art.binary.read_text() == "ELF\n"
    assert art.kernel == "main:lm_head_gemv_s1"
    lines = calls.read_text().splitlines()
    assert lines[0].startswith("peano ") and "mv_k64_c64_m4_r4.o" in lines[0] and "--target=aie2p-none-unknown-elf" in lines[0]
    assert f"-I{tc.aie_include}" in lines[0].split()               # aie_api headers from mlir-aie
    aircc = lines[1].split()
    for flag in ("--device npu2", "--output-format elf", f"--peano {tc.peano}", "--no-xchesscc"):
        assert flag in " ".join(aircc)
    assert "--air-runtime-loop-tiling-sizes=16" in aircc          # the declaration's preset
    assert rep.results[0].times["aircc"] is not None and rep.results[0].times["aiecc"] is None
    assert _status(B.build_modules([gemv_mod("lm_head_gemv_s1")], cache, "npu", progress=False,
                                   toolchain=tc)) == {"lm_head_gemv_s1": "skipped"}


def test_npu_toolchain_version_change_rebuilds(tmp_path, fake_npu_toolchain, monkeypatch):
    tc, _ = fake_npu_toolchain
    cache = tmp_path / "cache"
    B.build_modules([gemv_mod("lm_head_gemv_s1")], cache, "npu", progress=False, toolchain=tc)
    monkeypatch.setenv("AIRCC_FAKE_VERSION", "2.0")
    rep = B.build_modules([gemv_mod("lm_head_gemv_s1")], cache, "npu", progress=False, toolchain=tc)
    assert _status(rep) == {"lm_head_gemv_s1": "built"}


def test_npu_aircc_failure_names_module_and_log(tmp_path, fake_npu_toolchain, monkeypatch):
    tc, _ = fake_npu_toolchain
    monkeypatch.setenv("AIRCC_FAKE_FAIL", "1")
    with pytest.raises(B.BuildError) as ei:
        B.build_modules([gemv_mod("lm_head_gemv_s1")], tmp_path / "c", "npu", progress=False, toolchain=tc)
    msg = str(ei.value)
    assert "module lm_head_gemv_s1: aircc failed (exit 3)" in msg
    log = Path(msg.split("log: ")[1].strip())
    assert "error: placement failed" in log.read_text()
    with pytest.raises(B.BuildError, match="not built"):
        B.load_artifacts(tmp_path / "c", "npu", names=["lm_head_gemv_s1"])


def test_compile_cli_builds_and_reports(tmp_path, capsys, tiny_model_dir):
    """One compile CLI (`llama-npu compile`) with every option, including --no-check and --only."""
    from llama_npu.cli import main
    args = ["compile", "--model", str(tiny_model_dir), "--device", "emu", "--cache-dir", str(tmp_path),
            "--no-progress", "--buckets", "16"]
    assert main(args + ["--only", "qkv_s16", "--no-check"]) == 0
    assert "1 built" in capsys.readouterr().out
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "up to date" in out and "0 failed" in out
    assert main(args + ["--only", "nope"]) == 2
    assert "unknown modules ['nope']" in capsys.readouterr().err


def test_npu_build_without_aie_api_headers_fails_clearly(tmp_path, fake_npu_toolchain, monkeypatch):
    import dataclasses
    tc, _ = fake_npu_toolchain
    monkeypatch.delenv("MLIR_AIE_INSTALL_DIR", raising=False)
    tc = dataclasses.replace(tc, aie_include=None)
    rep = B.build_modules([gemv_mod("lm_head_gemv_s1")], tmp_path / "c", "npu", progress=False, toolchain=tc,
                          raise_on_error=False)
    assert _status(rep) == {"lm_head_gemv_s1": "failed"}
    assert "aie_api headers" in rep.results[0].error and "MLIR_AIE_INSTALL_DIR" in rep.results[0].error


@pytest.mark.parametrize("damage", ["targets_list", "files_list", "sha_none", "dir_outside"])
def test_structurally_damaged_manifest_rebuilds(tmp_path, damage):
    decls = [add_norm()]
    _build(tmp_path, decls)
    m = json.loads((tmp_path / B.MANIFEST).read_text())
    entry = m["targets"]["emu"]["add_norm"]
    if damage == "targets_list":
        m["targets"]["emu"] = [1]
    elif damage == "files_list":
        entry["files"] = ["add_norm.mlir"]
    elif damage == "sha_none":
        entry["sha256"] = None
    else:  # an entry pointing outside the cache at a file whose hash it records
        outside = tmp_path.parent / f"{tmp_path.name}_outside"
        outside.mkdir()
        (outside / "add_norm.mlir").write_text("module {}\n")
        entry["dir"] = str(outside)
        entry["sha256"]["mlir"] = sha256_file(outside / "add_norm.mlir")
    (tmp_path / B.MANIFEST).write_text(json.dumps(m))
    with pytest.raises(B.BuildError, match="add_norm: (not built|stale or damaged)"):
        B.load_artifacts(tmp_path, "emu", decls)
    assert _status(_build(tmp_path, decls)) == {"add_norm": "built"}


def test_unusable_cache_dir_is_one_line(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(B.BuildError, match="is not usable"):
        _build(blocker / "cache", [add_norm()])


def test_staging_left_by_a_killed_build_is_removed(tmp_path):
    stale = tmp_path / ".tmp" / "emu.add_norm.abc123"
    (stale / "out").mkdir(parents=True)
    other = tmp_path / ".tmp" / "npu.add_norm.def456"     # another target's build: not ours to remove
    other.mkdir()
    _build(tmp_path, [add_norm()])
    assert not stale.exists() and other.exists()


def test_npu_compile_needs_no_device_or_xrt(tmp_path, fake_npu_toolchain):
    """`make compile DEVICE=npu` on a build machine: aircc, aiecc and Peano are enough (no NPU, no pyxrt);
    without a compiler it is one line naming what is missing."""
    import dataclasses
    from kernel_builder.toolchain import ToolchainMissing, resolve_device_kind
    tc, _ = fake_npu_toolchain
    build_only = dataclasses.replace(tc, pyxrt=False, npu=None)
    rep = B.build_modules([gemv_mod("lm_head_gemv_s1")], tmp_path / "c", "npu", progress=False, toolchain=build_only)
    assert _status(rep) == {"lm_head_gemv_s1": "built"}
    assert resolve_device_kind("npu", toolchain=build_only, compile_only=True) == "npu"
    with pytest.raises(ToolchainMissing, match="pyxrt"):
        resolve_device_kind("npu", toolchain=build_only)                 # running still needs everything
    no_peano = dataclasses.replace(build_only, peano=None)
    with pytest.raises(ToolchainMissing, match=r"^compiling for the NPU needs aircc, aiecc and Peano; missing: Peano"):
        B.build_modules([gemv_mod()], tmp_path / "d", "npu", progress=False, toolchain=no_peano)
