"""Build driver: declarations -> kernel builders -> stitcher -> (externals, aircc/aiecc) -> cache dir.

Every module is keyed by a content hash: sha256 of the stitched text, the external kernels it links
(fingerprints + Peano flags), its aircc preset (npu), the toolchain versions and BUILD_FORMAT. An
artifact is reused only when the manifest entry has the same key and every file is present with its
recorded sha256; anything else (corrupt manifest, changed builder, new toolchain) rebuilds.

Writes are atomic: a module is built in a temp dir inside the cache dir and moved into place with
os.replace; the manifest is rewritten with temp file + os.replace. A file lock (filelock) on
cache_dir/.lock guards manifest read-modify-write and artifact moves; a per-module lock serialises
concurrent builds of the same module (the second process then finds it up to date).

The command line is `llama-npu compile` (llama_npu.cli); this module is its library.
"""
from __future__ import annotations

import contextlib
import dataclasses
import datetime
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from filelock import FileLock

from .decl import ModuleDecl
from .devices.base import Artifact
from .toolchain import (DEVICE_KINDS, Toolchain, detect,
                        toolchain_versions)

BUILD_FORMAT = 1
MANIFEST = "manifest.json"
STAGES = ("generate", "stitch", "externals", "check", "aircc", "aiecc")
_LINK_WITH = re.compile(r'link_with\s*=\s*"([^"]+)"')
_PUBLIC_FUNC = re.compile(r"func\.func\s+@([\w.$-]+)\s*\(")


class BuildError(RuntimeError):
    def __init__(self, message: str, report: "BuildReport | None" = None):
        super().__init__(message)
        self.report = report


# ---------------------------------------------------------------- externals linked by a module

@dataclass(frozen=True)
class ExternalRef:
    obj: str                       # object file named by link_with
    kernel: object | None          # externals.ExternalKernel that builds it (None: unknown object)
    fingerprint: str


def _kernel_for_object(obj: str):
    """Map a link_with object name to the ExternalKernel that produces it (None if unknown)."""
    from .externals import kernel_for_object
    return kernel_for_object(obj)


def _fallback_fingerprint(obj: str) -> str:
    """Unknown object: hash the .cc sources whose stem starts the object name (plus headers)."""
    from .externals import SOURCE_DIR
    h = hashlib.sha256(obj.encode())
    stem = obj.split(".")[0]
    for p in sorted(SOURCE_DIR.glob("*.cc")) + sorted(SOURCE_DIR.glob("*.h")):
        if p.suffix == ".h" or stem.startswith(p.stem):
            h.update(p.name.encode() + b"\0" + p.read_bytes())
    return "unknown:" + h.hexdigest()


def externals_for_text(text: str) -> list[ExternalRef]:
    """Every distinct `link_with = "x.o"` object in a module text, with its kernel and fingerprint."""
    from .externals import kernel_fingerprint
    refs = []
    for obj in sorted(set(_LINK_WITH.findall(text))):
        try:
            kernel = _kernel_for_object(obj)
        except ValueError:
            kernel = None
        fp = kernel_fingerprint(kernel) if kernel is not None else _fallback_fingerprint(obj)
        refs.append(ExternalRef(obj, kernel, fp))
    return refs


def target_of(device_kind: str) -> str:
    """emu and null run the same artifact (the stitched text), so they share one cache target."""
    if device_kind not in DEVICE_KINDS:
        raise ValueError(f"unknown device kind {device_kind!r}; expected one of {DEVICE_KINDS}")
    return "npu" if device_kind == "npu" else "emu"


def module_key(text: str, externals: list[ExternalRef], target: str, versions: dict,
               preset_flags: list[str]) -> str:
    h = hashlib.sha256()
    blob = {"build_format": BUILD_FORMAT, "target": target, "versions": versions,
            "preset": preset_flags if target == "npu" else [],
            "externals": [[r.obj, r.fingerprint] for r in externals]}
    h.update(json.dumps(blob, sort_keys=True).encode())
    h.update(b"\0")
    h.update(text.encode())
    return h.hexdigest()


# ---------------------------------------------------------------- locks, atomic files, manifest

@contextlib.contextmanager
def _flock(path: Path):
    """An exclusive inter-process lock on `path` (filelock; blocks until free)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(path)):
        yield


def atomic_write_text(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def read_manifest(cache_dir: Path) -> dict:
    """The manifest, or an empty one when missing, unreadable or of another BUILD_FORMAT."""
    try:
        data = json.loads((cache_dir / MANIFEST).read_text())
    except (OSError, ValueError):
        return {"build_format": BUILD_FORMAT, "targets": {}}
    if (not isinstance(data, dict) or data.get("build_format") != BUILD_FORMAT
            or not isinstance(data.get("targets"), dict)):
        return {"build_format": BUILD_FORMAT, "targets": {}}
    # Structurally damaged parts (hand edits, another tool) are dropped, which means "rebuild".
    data["targets"] = {t: {n: e for n, e in mods.items() if isinstance(n, str) and isinstance(e, dict)}
                       for t, mods in data["targets"].items() if isinstance(mods, dict)}
    return data


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _entry_valid(cache_dir: Path, entry, key: str | None) -> bool:
    """Same key (when given), every recorded file present with its recorded sha256."""
    try:
        if not isinstance(entry.get("key"), str) or (key is not None and entry["key"] != key):
            return False
        if not isinstance(entry.get("kernel", "main"), str):
            return False
        root = cache_dir.resolve()
        base = (cache_dir / entry["dir"]).resolve()
        if root not in base.parents:      # an entry may only name files inside this cache
            return False
        files, sha = entry["files"], entry["sha256"]
        if not isinstance(files, dict) or not isinstance(sha, dict) or "mlir" not in files:
            return False
        for role, rel in files.items():
            p = (base / rel).resolve()
            if base not in p.parents or not p.is_file() or _sha256_file(p) != sha[role]:
                return False
        return True
    except (KeyError, TypeError, AttributeError, ValueError, OSError):
        return False


def _artifact_from_entry(cache_dir: Path, name: str, entry: dict) -> Artifact:
    base = cache_dir / entry["dir"]
    files = entry["files"]
    get = lambda role: (base / files[role]) if role in files else None  # noqa: E731
    return Artifact(name=name, mlir=base / files["mlir"], binary=get("binary"), insts=get("insts"),
                    xclbin=get("xclbin"), kernel=entry.get("kernel", "main"),
                    meta={"key": entry["key"], "times": entry.get("times", {}), "log": str(get("log") or "")})


# ---------------------------------------------------------------- per-stage work

def generate(decl: ModuleDecl) -> ModuleDecl:
    """Run every Launch.build once; return a decl whose launches replay the generated texts, so the
    stitcher does not generate again (and the generate stage is timed on its own)."""
    launches = []
    for launch in decl.launches:
        try:
            text = launch.build()
        except Exception as e:
            raise BuildError(f"module {decl.name}: launch {launch.prefix!r} failed to generate: "
                             f"{type(e).__name__}: {e}") from e
        launches.append(dataclasses.replace(launch, build=(lambda t=text: t)))
    return dataclasses.replace(decl, launches=tuple(launches))


def stitch_text(decl: ModuleDecl) -> str:
    from .stitching import stitch
    try:
        return stitch(decl)
    except Exception as e:
        raise BuildError(f"module {decl.name}: stitching failed: {type(e).__name__}: {e}") from e


def _run_logged(cmd: list[str], log: Path, cwd: Path, what: str, module: str) -> None:
    with open(log, "a") as f:
        f.write(f"$ {' '.join(cmd)}\n")
        f.flush()
        r = subprocess.run(cmd, cwd=cwd, stdout=f, stderr=subprocess.STDOUT)
    if r.returncode != 0:
        raise BuildError(f"module {module}: {what} failed (exit {r.returncode}); log: {log}")


def _compile_npu(name: str, text: str, refs: list[ExternalRef], work: Path, out: Path, tc: Toolchain,
                 times: dict, log: Path, preset_flags: list[str]) -> dict[str, str]:
    """Peano for the externals, then aircc (which drives aiecc) -> <name>.elf. Returns files by role.
    Every command and its output go to `log` (outside the staging dir, so it survives a failure)."""
    from .externals import aie_include_dir_from_env, compile_command
    t0 = time.perf_counter()
    include = Path(tc.aie_include) if tc.aie_include else aie_include_dir_from_env()
    if refs and include is None:
        raise BuildError(f"module {name}: the aie_api headers of mlir-aie were not found (set "
                         f"MLIR_AIE_INSTALL_DIR; see docs/npu-setup.md#mlir-aie)")
    for r in refs:
        if r.kernel is None:
            raise BuildError(f"module {name}: no external kernel rule produces {r.obj}; log: {log}")
        _run_logged(compile_command(r.kernel, work, Path(tc.peano), include), log, work,
                    f"Peano compile of {r.obj}", name)
    times["externals"] = time.perf_counter() - t0

    src = work / "air.mlir"
    src.write_text(text)
    elf = out / f"{name}.elf"
    cmd = [tc.aircc, str(src), "--device", "npu2", "--output-format", "elf", "--elf-name", str(elf),
           "--tmpdir", str(work / "air_project"), "--peano", str(tc.peano), "--no-xchesscc", "--no-xbridge",
           *preset_flags]
    env_path = os.pathsep.join([str(Path(tc.aiecc).parent), os.environ.get("PATH", "")])
    t0 = time.perf_counter()
    with open(log, "a") as f:
        f.write(f"$ {' '.join(cmd)}\n")
        f.flush()
        # cwd = work: aiecc resolves link_with objects and writes --get-* artifacts relative to it.
        r = subprocess.run(cmd, cwd=work, stdout=f, stderr=subprocess.STDOUT, env={**os.environ, "PATH": env_path})
    times["aircc"] = time.perf_counter() - t0
    times["aiecc"] = None  # aiecc runs inside aircc; its time is part of the aircc column
    if r.returncode != 0:
        raise BuildError(f"module {name}: aircc failed (exit {r.returncode}); log: {log}")
    if not elf.is_file():
        raise BuildError(f"module {name}: aircc succeeded but wrote no {elf.name}; log: {log}")
    shutil.copy(log, out / "build.log")
    return {"binary": elf.name, "log": "build.log"}


# ---------------------------------------------------------------- report

@dataclass
class ModuleResult:
    name: str
    status: str                     # "built" | "skipped" | "failed"
    key: str = ""
    times: dict = field(default_factory=dict)
    artifact: Artifact | None = None
    error: str = ""
    notes: list[str] = field(default_factory=list)
    hw: object = None               # kernel_builder.hw.ModuleReport (None when the model could not read it)


@dataclass
class BuildReport:
    device_kind: str
    cache_dir: Path
    results: list[ModuleResult] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(r.status != "failed" for r in self.results)

    @property
    def artifacts(self) -> dict[str, Artifact]:
        return {r.name: r.artifact for r in self.results if r.artifact is not None}

    def by_status(self, status: str) -> list[str]:
        return [r.name for r in self.results if r.status == status]

    def table(self) -> str:
        w = max([len("module")] + [len(r.name) for r in self.results])
        head = f"{'module':<{w}}  {'status':<7}" + "".join(f"  {s:>9}" for s in STAGES) + f"  {'total':>8}"
        lines = [head, "-" * len(head)]
        for r in self.results:
            cells = []
            for s in STAGES:
                v = r.times.get(s)
                cells.append(f"  {'-':>9}" if v is None else f"  {v:9.3f}")
            total = sum(v for v in r.times.values() if v)
            lines.append(f"{r.name:<{w}}  {r.status:<7}" + "".join(cells) + f"  {total:8.3f}")
        lines.append(f"{len(self.by_status('built'))} built, {len(self.by_status('skipped'))} up to date, "
                     f"{len(self.by_status('failed'))} failed  (device {self.device_kind}, cache {self.cache_dir})")
        for r in self.results:
            if r.error:
                lines.append(f"FAILED {r.name}: {r.error}")
        lines += [f"note: {n}" for n in self.notes]
        from .hw.report import build_summary
        lines += build_summary(self.results, self.device_kind)
        return "\n".join(lines)

    __str__ = table


# ---------------------------------------------------------------- driver

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
    hw, hw_notes = _hw_gate(name, text, target, hw_check, decl.preset)  # NPU2 hardware model (kernel_builder/hw)
    refs = externals_for_text(text)
    key = module_key(text, refs, target, versions, decl.preset.flags())

    with _flock(cache_dir / ".locks" / f"{target}.{name}.lock"):
        with _flock(cache_dir / ".lock"):
            entry = read_manifest(cache_dir)["targets"].get(target, {}).get(name)
        if not force and entry is not None and _entry_valid(cache_dir, entry, key):
            return ModuleResult(name, "skipped", key, times, _artifact_from_entry(cache_dir, name, entry),
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
                files.update(_compile_npu(name, text, refs, work, out, tc, times, log, decl.preset.flags()))
                m = _PUBLIC_FUNC.search(text.replace("func.func private", "func.func_private"))
                kernel = f"main:{m[1] if m else name}"
            elif check:
                from .mlir_check import check_text
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
            sha = {role: _sha256_file(out / rel) for role, rel in files.items()}
            rel_dir = Path(target) / name / key[:16]
            final = cache_dir / rel_dir
            new_entry = {"key": key, "dir": str(rel_dir), "files": files, "sha256": sha, "kernel": kernel,
                         "times": times, "versions": versions,
                         "built_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
            with _flock(cache_dir / ".lock"):
                final.parent.mkdir(parents=True, exist_ok=True)
                if final.exists():
                    shutil.rmtree(final)
                os.replace(out, final)
                manifest = read_manifest(cache_dir)
                manifest["targets"].setdefault(target, {})[name] = new_entry
                atomic_write_text(cache_dir / MANIFEST, json.dumps(manifest, indent=1, sort_keys=True))
                for old in final.parent.iterdir():  # artifacts of superseded keys
                    if old != final and old.is_dir():
                        shutil.rmtree(old, ignore_errors=True)
            return ModuleResult(name, "built", key, times, _artifact_from_entry(cache_dir, name, new_entry),
                                notes=notes + hw_notes, hw=hw)
        finally:
            shutil.rmtree(staging, ignore_errors=True)


def _hw_gate(name: str, text: str, target: str, enforce: bool, preset):
    """(ModuleReport | None, notes): on the NPU a module over an NPU2 limit fails its build with one line."""
    from .hw.report import HwCheckError, gate
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
        with _flock(cache_dir / ".lock"):
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
        from .mlir_check import MLIR_OPT
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
        keys[d.name] = module_key(text, externals_for_text(text), target, versions, d.preset.flags())
    return keys


def entry_valid(cache_dir: Path, entry, key: str | None) -> bool:
    """Public form of the reuse test: same key (when given), every recorded file present and intact."""
    return _entry_valid(Path(cache_dir), entry, key)


def load_artifacts(cache_dir: Path, device_kind: str, decls: list[ModuleDecl] | None = None,
                   names: list[str] | None = None) -> dict[str, Artifact]:
    """Artifacts recorded in the manifest. With decls, each module's key is recomputed from the
    current builders/toolchain and a mismatch raises (never a stale load)."""
    cache_dir = Path(cache_dir)
    target = target_of(device_kind)
    with _flock(cache_dir / ".lock"):
        entries = read_manifest(cache_dir)["targets"].get(target, {})
    wanted = names if names is not None else ([d.name for d in decls] if decls is not None else list(entries))
    keys: dict[str, str] = {}
    if decls is not None:
        versions = toolchain_versions(target, detect() if target == "npu" else None)
        keys = module_keys([d for d in decls if d.name in wanted], target, versions)
    out = {}
    for name in wanted:
        entry = entries.get(name)
        if entry is None or not _entry_valid(cache_dir, entry, keys.get(name)):
            why = "not built" if entry is None else "stale or damaged"
            raise BuildError(f"module {name}: {why} in {cache_dir} for device {device_kind}; "
                             f"run `llama-npu compile` (DEVICE={device_kind})")
        out[name] = _artifact_from_entry(cache_dir, name, entry)
    return out
