"""Detection of the NPU toolchain (aircc, aiecc, Peano, pyxrt, an NPU) and its versions.

`DEVICE=npu` without every piece raises ToolchainMissing whose message is ONE line naming every
missing piece and the docs/npu-setup.md section that fixes it. `auto` picks npu only when
everything is present, else emu (with a one-line notice on stderr).
"""
from __future__ import annotations

import glob
import importlib.metadata
import importlib.util
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

# emu-interp: emu that interprets each launch's herds/DMAs from the AIR text (slow; for tiling checks).
DEVICE_KINDS = ("npu", "emu", "emu-interp", "null")
SETUP_DOC = "docs/npu-setup.md"
# Bumped when the emulator's artifact interpretation changes; part of the emu cache key.
EMU_FORMAT_VERSION = 1

# piece -> (human name, docs/npu-setup.md anchor)
PIECES = {
    "aircc": ("aircc (mlir_air)", "mlir-air"),
    "aiecc": ("aiecc (mlir_aie)", "mlir-aie"),
    "peano": ("Peano (llvm-aie)", "peano"),
    "pyxrt": ("pyxrt (XRT >= 2.19)", "xrt"),
    "npu": ("NPU device (/dev/accel/accel* bound to amdxdna)", "amdxdna-driver"),
}


# what compiling for npu2 needs (no device, no XRT: a build machine can compile, as the reference's flow does)
COMPILE_PIECES = ("aircc", "aiecc", "peano")


class ToolchainMissing(RuntimeError):
    """One line: every missing piece, each with the setup-doc section that installs it."""

    def __init__(self, missing: list[str], compile_only: bool = False):
        self.missing = list(missing)
        parts = [f"{PIECES[m][0]} -> {SETUP_DOC}#{PIECES[m][1]}" for m in self.missing]
        what = "compiling for the NPU needs aircc, aiecc and Peano" if compile_only else \
            "DEVICE=npu but the NPU toolchain is incomplete"
        super().__init__(f"{what}; missing: " + "; ".join(parts))


@dataclass
class Toolchain:
    aircc: str | None = None
    aiecc: str | None = None
    peano: str | None = None        # Peano install dir (holds bin/clang)
    pyxrt: bool = False
    npu: str | None = None          # how the device was found, e.g. "/dev/accel/accel0 (amdxdna)"
    aie_include: str | None = None  # mlir-aie's include dir (holds aie_api/) for the external kernels
    notes: list[str] = field(default_factory=list)

    def missing(self) -> list[str]:
        have = {"aircc": self.aircc, "aiecc": self.aiecc, "peano": self.peano,
                "pyxrt": self.pyxrt, "npu": self.npu}
        return [k for k in PIECES if not have[k]]

    @property
    def complete(self) -> bool:
        return not self.missing()

    def require(self, compile_only: bool = False) -> "Toolchain":
        """Every piece (running), or only the compilers (compile_only); ToolchainMissing otherwise."""
        missing = [m for m in self.missing() if not compile_only or m in COMPILE_PIECES]
        if missing:
            raise ToolchainMissing(missing, compile_only)
        return self


# ---------------------------------------------------------------- tool locations

def _package_dir(dist: str, subdir: str) -> Path | None:
    """Directory `subdir` of an installed distribution (wheel data dirs such as llvm-aie/)."""
    try:
        p = Path(importlib.metadata.distribution(dist).locate_file(subdir))
    except Exception:
        return None
    return p if p.is_dir() else None


def _find_tool(names: tuple[str, ...], dists: tuple[tuple[str, str], ...], env: dict) -> str | None:
    """PATH first (a user's explicit environment wins), then the bin/ dir of a wheel install."""
    for n in names:
        found = shutil.which(n, path=env.get("PATH", os.defpath))
        if found:
            return found
    for dist, sub in dists:
        d = _package_dir(dist, sub)
        if d is None:
            continue
        for n in names:
            cand = d / "bin" / n
            if cand.is_file() and os.access(cand, os.X_OK):
                return str(cand)
    return None


def find_aircc(env: dict | None = None) -> str | None:
    return _find_tool(("aircc",), (("mlir_air", "mlir_air"), ("mlir-air", "mlir_air")), env or os.environ)


def find_aiecc(env: dict | None = None) -> str | None:
    return _find_tool(("aiecc", "aiecc.py"), (("mlir_aie", "mlir_aie"), ("mlir-aie", "mlir_aie")),
                      env or os.environ)


def find_peano(env: dict | None = None) -> str | None:
    """PEANO_INSTALL_DIR if it is a directory, else the llvm-aie wheel's data directory."""
    env = env or os.environ
    explicit = env.get("PEANO_INSTALL_DIR", "")
    if explicit and Path(explicit).is_dir():
        return str(Path(explicit).resolve())
    d = _package_dir("llvm-aie", "llvm-aie") or _package_dir("llvm_aie", "llvm-aie")
    return str(d) if d else None


def find_aie_include(env: dict | None = None, aiecc: str | None = None) -> str | None:
    """mlir-aie's `include` dir (the one holding aie_api/aie.hpp) for the Peano compile of external
    kernels: $MLIR_AIE_INSTALL_DIR/include, else <install>/include next to the resolved aiecc or
    aie-opt binary (<install>/bin/...), else the mlir_aie wheel's mlir_aie/include."""
    env = env or os.environ
    cands: list[Path] = []
    root = env.get("MLIR_AIE_INSTALL_DIR", "")
    if root:
        cands.append(Path(root) / "include")
    for tool in (aiecc, shutil.which("aie-opt", path=env.get("PATH", os.defpath))):
        if tool:
            cands.append(Path(os.path.realpath(tool)).parent.parent / "include")
    for dist in ("mlir_aie", "mlir-aie"):
        d = _package_dir(dist, "mlir_aie")
        if d is not None:
            cands.append(d / "include")
    for c in cands:
        if (c / "aie_api").is_dir():
            return str(c.resolve())
    return None


def pyxrt_importable() -> bool:
    if "pyxrt" in sys.modules:
        return sys.modules["pyxrt"] is not None
    try:
        return importlib.util.find_spec("pyxrt") is not None
    except (ImportError, ValueError):
        return False


def find_npu(accel_glob: str = "/dev/accel/accel*", xrt_smi: str | None = None) -> str | None:
    """An accel node bound to the amdxdna driver, else an NPU listed by `xrt-smi examine`."""
    for node in sorted(glob.glob(accel_glob)):
        drv = Path("/sys/class/accel") / Path(node).name / "device" / "driver"
        try:
            name = os.path.basename(os.readlink(drv))
        except OSError:
            name = ""
        if name == "amdxdna":
            return f"{node} (amdxdna)"
    smi = xrt_smi or shutil.which("xrt-smi") or "/opt/xilinx/xrt/bin/xrt-smi"
    if os.path.isfile(smi):
        try:
            out = subprocess.run([smi, "examine"], capture_output=True, text=True, timeout=10).stdout
        except (OSError, subprocess.SubprocessError):
            return None
        low = out.lower()
        if any(k in low for k in ("npu", "strix", "krackan", "ryzen ai")):
            return "xrt-smi examine"
    return None


def detect(env: dict | None = None, accel_glob: str = "/dev/accel/accel*") -> Toolchain:
    env = dict(os.environ if env is None else env)
    aiecc = find_aiecc(env)
    return Toolchain(aircc=find_aircc(env), aiecc=aiecc, peano=find_peano(env),
                     pyxrt=pyxrt_importable(), npu=find_npu(accel_glob),
                     aie_include=find_aie_include(env, aiecc))


# ---------------------------------------------------------------- versions (cache key)

def version_line(stdout: str, stderr: str, returncode: int | None, failure: str | None = None) -> str:
    """The version string of a `tool --version` run as the cache key records it: up to three
    non-empty lines of stdout (else stderr) joined, `rc=N` when both are empty, or
    `unavailable (<exception name>)` when the tool could not run."""
    if failure:
        return f"unavailable ({failure})"
    text = (stdout or stderr).strip()
    # LLVM tools print a banner line first; keep the informative lines, joined.
    return " | ".join(line.strip() for line in text.splitlines()[:3] if line.strip()) or f"rc={returncode}"


def _first_line(cmd: list[str]) -> str:
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as e:
        return version_line("", "", None, type(e).__name__)
    return version_line(r.stdout, r.stderr, r.returncode)


def _dist_version(*names: str) -> str | None:
    for n in names:
        try:
            return importlib.metadata.version(n)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def toolchain_versions(kind: str, tc: Toolchain | None = None, first_line=None,
                       dist_version=None) -> dict[str, str]:
    """Version strings that identify the compiler; any change invalidates the build cache.

    `first_line(cmd) -> str` and `dist_version(*names) -> str | None` default to running the tool
    and reading the installed wheel's metadata; `llama-npu doctor` passes its own (with its command
    runner and timeouts) to recompute the same strings."""
    if kind in ("emu", "emu-interp", "null"):
        return {"emu": f"emu-{EMU_FORMAT_VERSION}"}
    if kind != "npu":
        raise ValueError(f"unknown device kind {kind!r}; expected one of {DEVICE_KINDS}")
    tc = tc or detect()
    first_line = first_line or _first_line
    dist_version = dist_version or _dist_version
    v: dict[str, str] = {}
    if tc.aircc:
        v["aircc"] = first_line([tc.aircc, "--version"])
        v["mlir_air"] = dist_version("mlir_air", "mlir-air") or "source-build"
    if tc.aiecc:
        v["aiecc"] = first_line([tc.aiecc, "--version"])
        v["mlir_aie"] = dist_version("mlir_aie", "mlir-aie") or "source-build"
    if tc.peano:
        v["peano"] = first_line([str(Path(tc.peano) / "bin" / "clang"), "--version"])
        v["llvm_aie"] = dist_version("llvm-aie", "llvm_aie") or "source-build"
    return v


# ---------------------------------------------------------------- device selection

def resolve_device_kind(name: str | None = "auto", env: dict | None = None,
                        toolchain: Toolchain | None = None, notice=None, compile_only: bool = False) -> str:
    """auto|npu|emu|null (None/'auto' also honour $DEVICE) -> the concrete kind.

    `npu` requested without a complete toolchain raises ToolchainMissing (with compile_only, only aircc,
    aiecc and Peano are needed: `make compile DEVICE=npu` on a machine without an NPU); `auto` falls back to
    emu with one line on stderr (or `notice(line)`)."""
    env = os.environ if env is None else env
    if name in (None, "", "auto"):
        name = env.get("DEVICE", "auto") or "auto"
    name = name.lower()
    if name in ("emu", "emu-interp", "null"):
        return name
    if name not in ("npu", "auto"):
        raise ValueError(f"unknown device {name!r}; expected auto, npu, emu, emu-interp or null")
    tc = toolchain or detect(env)
    if name == "npu":
        tc.require(compile_only)
        return "npu"
    if tc.complete:
        return "npu"
    line = ("llama-npu: no complete NPU toolchain (missing: " + ", ".join(tc.missing())
            + f"); using the emu device. See {SETUP_DOC}")
    (notice or (lambda s: print(s, file=sys.stderr)))(line)
    return "emu"
