"""The build driver: generate every launch, stitch, gate on the NPU2 hardware model, then reuse the cached
artifact of the same key or build it (npu: Peano + aircc; emu/null: the stitched text, checked with
mlir-opt-22) in a staging dir and move it into place under the cache lock."""
from __future__ import annotations

import dataclasses
import datetime
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from ..decl import ModuleDecl
from ..devices.base import Artifact
from kernel_builder.presets import preset_of_text
from kernel_builder.toolchain import Toolchain, detect, toolchain_versions
from .keys import externals_for_text, module_key, target_of
from .npu import compile_npu, elf_kernel
from multi_launch_builder.compile.build_report import BuildError, BuildReport, ModuleResult
from .store import MANIFEST, artifact_from_entry, atomic_write_text, entry_valid, flock, read_manifest, sha256_file


def generate(decl: ModuleDecl) -> ModuleDecl:
    """Run every Launch.build once; return a decl whose launches replay the generated texts, so the
    stitcher does not generate again (and the generate stage is timed on its own), with its aircc preset
    resolved (ModuleDecl.aircc_preset: declared, or derived from these texts by the hardware model)."""
    launches = []
    for launch in decl.launches:
        try:
            text = launch.build()
        except Exception as e:
            raise BuildError(f"module {decl.name}: launch {launch.prefix!r} failed to generate: "
                             f"{type(e).__name__}: {e}") from e
        launches.append(dataclasses.replace(launch, build=(lambda t=text: t)))
    replay = dataclasses.replace(decl, launches=tuple(launches))
    return dataclasses.replace(replay, preset=replay.aircc_preset())


def stitch_text(decl: ModuleDecl) -> str:
    from multi_launch_builder.stitcher import stitch
    try:
        return stitch(decl)
    except Exception as e:
        raise BuildError(f"module {decl.name}: stitching failed: {type(e).__name__}: {e}") from e


def _build_one(decl: ModuleDecl, cache_dir: Path, target: str, versions: dict, tc: Toolchain | None,
               force: bool, check: bool, hw_check: bool = True) -> ModuleResult:
    name = decl.name
    times: dict = {}
    t0 = time.perf_counter()
    gen = generate(decl)
    times["generate"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    text = stitch_text(gen)
    times["stitch"] = time.perf_counter() - t0
    preset = preset_of_text(text)   # chosen in generate(), recorded in the stitched header; it keys the artifact
    hw, hw_notes = _hw_gate(name, text, target, hw_check, preset)  # NPU2 hardware model (kernel_builder/hw)
    refs = externals_for_text(text)
    key = module_key(text, refs, target, versions, preset.flags())

    with flock(cache_dir / ".locks" / f"{target}.{name}.lock"):
        with flock(cache_dir / ".lock"):
            entry = read_manifest(cache_dir)["targets"].get(target, {}).get(name)
        if not force and entry is not None and entry_valid(cache_dir, entry, key):
            return ModuleResult(name, "skipped", key, times, artifact_from_entry(cache_dir, name, entry),
                                notes=hw_notes, hw=hw)

        tmp_root = cache_dir / ".tmp"
        tmp_root.mkdir(parents=True, exist_ok=True)
        # Staging dirs of this (target, module) left by a killed build: nobody else can be using
        # them while we hold the module lock.
        for stale in tmp_root.glob(f"{target}.{name}.*"):
            shutil.rmtree(stale, ignore_errors=True)
        staging = Path(tempfile.mkdtemp(prefix=f"{target}.{name}.", dir=tmp_root))
        try:
            out = staging / "out"
            out.mkdir()
            files = {"mlir": f"{name}.mlir"}
            (out / files["mlir"]).write_text(text)
            notes: list[str] = []
            kernel = "main"
            if target == "npu":
                work = staging / "work"
                work.mkdir()
                log = cache_dir / "logs" / f"{name}.log"
                log.parent.mkdir(exist_ok=True)
                log.write_text("")
                files.update(compile_npu(name, text, refs, work, out, tc, times, log, preset.flags()))
                kernel = elf_kernel(name, text)
            elif check:
                from kernel_builder.mlir_check import check_text
                t0 = time.perf_counter()
                res = check_text(text)
                times["check"] = time.perf_counter() - t0
                notes += res.notes
                if not res.ok:
                    log = cache_dir / "logs" / f"{name}.check.log"
                    log.parent.mkdir(exist_ok=True)
                    log.write_text(res.stderr + "\n")
                    raise BuildError(f"module {name}: mlir-opt-22 rejected the non-AIR parts of the "
                                     f"stitched text: {res.stderr.splitlines()[0] if res.stderr else '?'}; "
                                     f"log: {log}")
            sha = {role: sha256_file(out / rel) for role, rel in files.items()}
            rel_dir = Path(target) / name / key[:16]
            final = cache_dir / rel_dir
            new_entry = {"key": key, "dir": str(rel_dir), "files": files, "sha256": sha, "kernel": kernel,
                         "times": times, "versions": versions,
                         "built_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
            with flock(cache_dir / ".lock"):
                final.parent.mkdir(parents=True, exist_ok=True)
                if final.exists():
                    shutil.rmtree(final)
                os.replace(out, final)
                manifest = read_manifest(cache_dir)
                manifest["targets"].setdefault(target, {})[name] = new_entry
                atomic_write_text(cache_dir / MANIFEST, json.dumps(manifest, indent=1, sort_keys=True))
                _prune_superseded(final)
            return ModuleResult(name, "built", key, times, artifact_from_entry(cache_dir, name, new_entry),
                                notes=notes + hw_notes, hw=hw)
        finally:
            shutil.rmtree(staging, ignore_errors=True)


# Artifacts of superseded keys kept per module: another process (a running `serve`, a `run` with other buckets)
# may still load the one it resolved, since modules are loaded lazily; older ones are removed.
KEEP_SUPERSEDED = 3


def _prune_superseded(final: Path) -> None:
    """Remove all but the newest KEEP_SUPERSEDED other key directories of `final`'s module (called under the lock)."""
    others = [d for d in final.parent.iterdir() if d != final and d.is_dir()]
    others.sort(key=lambda d: d.stat().st_mtime, reverse=True)
    for old in others[KEEP_SUPERSEDED:]:
        shutil.rmtree(old, ignore_errors=True)


def _hw_gate(name: str, text: str, target: str, enforce: bool, preset):
    """(ModuleReport | None, notes): on the NPU a module over an NPU2 limit fails its build with one line."""
    from kernel_builder.hw.module_report import HwCheckError, gate
    try:
        rep, note = gate(name, text, target, enforce, preset)
    except HwCheckError as e:
        raise BuildError(str(e)) from None
    return rep, [note] if note else []


def build_modules(decls: list[ModuleDecl], cache_dir: Path, device_kind: str = "emu", progress: bool = True,
                  force: bool = False, check: bool = True, raise_on_error: bool = True,
                  toolchain: Toolchain | None = None, hw_check: bool = True) -> BuildReport:
    """Build (or reuse) every module for `device_kind` ("npu" | "emu" | "null") into cache_dir.

    Failures of single modules are collected; with raise_on_error a BuildError naming every failed
    module (and its log) is raised after the whole list was attempted."""
    cache_dir = Path(cache_dir)
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
        with flock(cache_dir / ".lock"):
            pass
    except OSError as e:
        raise BuildError(f"kernel cache directory {cache_dir} is not usable: "
                         f"{e.strerror or type(e).__name__}") from e
    target = target_of(device_kind)
    tc = None
    if target == "npu":
        tc = (toolchain or detect()).require(compile_only=True)   # building needs no device
    versions = toolchain_versions(target, tc)
    names = [d.name for d in decls]
    dup = {n for n in names if names.count(n) > 1}
    if dup:
        raise ValueError(f"duplicate module names in the build list: {sorted(dup)}")
    report = BuildReport(device_kind, cache_dir)
    if target == "emu" and check:
        from kernel_builder.mlir_check import MLIR_OPT
        if not shutil.which(MLIR_OPT):
            report.notes.append(f"{MLIR_OPT} not found: stitched texts were not checked")
    bar = None
    if progress:
        try:
            from tqdm import tqdm
            bar = tqdm(total=len(decls), desc=f"compile ({device_kind})", unit="module", file=sys.stderr,
                       leave=False)
        except ImportError:  # pragma: no cover
            bar = None
    try:
        for decl in decls:
            if bar is not None:
                bar.set_postfix_str(decl.name)
            try:
                res = _build_one(decl, cache_dir, target, versions, tc, force, check, hw_check)
            except BuildError as e:
                res = ModuleResult(decl.name, "failed", error=str(e))
            except Exception as e:
                res = ModuleResult(decl.name, "failed", error=f"{type(e).__name__}: {e}")
            report.results.append(res)
            if bar is not None:
                bar.update(1)
    finally:
        if bar is not None:
            bar.close()
    if raise_on_error and not report.ok:
        failed = [r for r in report.results if r.status == "failed"]
        raise BuildError("; ".join(f"{r.error}" if r.error.startswith(f"module {r.name}") else
                                   f"module {r.name}: {r.error}" for r in failed), report)
    return report


def module_keys(decls: list[ModuleDecl], target: str, versions: dict) -> dict[str, str]:
    """Each module's cache key as a build would compute it now (generate + stitch, nothing compiled)."""
    keys = {}
    for d in decls:
        text = stitch_text(generate(d))
        keys[d.name] = module_key(text, externals_for_text(text), target, versions, preset_of_text(text).flags())
    return keys


def load_artifacts(cache_dir: Path, device_kind: str, decls: list[ModuleDecl] | None = None,
                   names: list[str] | None = None) -> dict[str, Artifact]:
    """Artifacts recorded in the manifest. With decls, each module's key is recomputed from the
    current builders/toolchain and a mismatch raises (never a stale load)."""
    cache_dir = Path(cache_dir)
    target = target_of(device_kind)
    with flock(cache_dir / ".lock"):
        entries = read_manifest(cache_dir)["targets"].get(target, {})
    wanted = names if names is not None else ([d.name for d in decls] if decls is not None else list(entries))
    keys: dict[str, str] = {}
    if decls is not None:
        versions = toolchain_versions(target, detect() if target == "npu" else None)
        keys = module_keys([d for d in decls if d.name in wanted], target, versions)
    out = {}
    for name in wanted:
        entry = entries.get(name)
        if entry is None or not entry_valid(cache_dir, entry, keys.get(name)):
            why = "not built" if entry is None else "stale or damaged"
            raise BuildError(f"module {name}: {why} in {cache_dir} for device {device_kind}; "
                             f"run `llama-npu compile` (DEVICE={device_kind})")
        out[name] = artifact_from_entry(cache_dir, name, entry)
    return out
