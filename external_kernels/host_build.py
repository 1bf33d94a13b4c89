"""The emulator's host kernels (external_kernels/host/*.cc): built once per machine with the host C++
compiler into one shared library and loaded through ctypes. kernel_builder.attention.host and
kernel_builder.gemv.host run them; kernel_builder.reference falls back to numpy when this returns None.

The library is cached under `<cache root>/host/`, its name a hash of the sources, the flags, the compiler's
version and the CPU (a filelock guards concurrent builds). Without a compiler, or with
LLAMA_NPU_HOST_KERNELS=numpy, the numpy paths run instead (a one-line notice says so when it was not asked
for).
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

from external_kernels.paths import HOST_SOURCE_DIR, cache_root

SOURCES = tuple(sorted(HOST_SOURCE_DIR.glob("*.cc")))
# -ffp-contract=off: every fma in the kernels is written out; the compiler must not fuse a mul and an add on
# its own (it would do so in one loop and not in another, and results would depend on the path they took).
FLAGS: tuple[str, ...] = ("-O3", "-std=c++17", "-fPIC", "-shared", "-ffp-contract=off")
NATIVE_FLAGS: tuple[str, ...] = ("-march=native",)
COMPILE_TIMEOUT_S = 300

_FP = ctypes.POINTER(ctypes.c_float)
_lock = threading.Lock()
_state: dict = {}


def _after_fork() -> None:          # a child must not inherit a lock held by a thread that is not there
    global _lock
    _lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork)


class HostKernelsUnavailable(RuntimeError):
    pass


def compiler() -> str | None:
    for name in (os.environ.get("CXX"), "g++", "c++", "clang++"):
        if name and shutil.which(name):
            return name
    return None


def _version(cxx: str) -> str:
    try:
        out = subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=30)
        return out.stdout.splitlines()[0] if out.stdout else ""
    except (OSError, subprocess.SubprocessError):
        return ""


def _cpu_id() -> str:
    """What -march=native depends on: the CPU's model and feature flags (a cache directory shared between
    machines must not hand one CPU a library built for another's instructions)."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
        return "\n".join(sorted({ln for ln in lines if ln.startswith(("model name", "flags", "Features"))}))
    except OSError:
        return platform.processor()


def build(cxx: str, out_dir: Path, extra: tuple[str, ...] = ()) -> Path:
    """Compile the kernels into one library in out_dir (once: the file name holds a hash of everything that goes in) and
    return the library path. Tries -march=native first (the AVX2 path on x86), then without it."""
    return build_library(cxx, out_dir, "host_kernels", SOURCES, [FLAGS + NATIVE_FLAGS + extra, FLAGS + extra])


def build_library(cxx: str, out_dir: Path, stem: str, sources, flag_sets, inputs: bytes = b"") -> Path:
    """Compile `sources` into `out_dir/<stem>-<hash>.so` once and return its path. The hash covers the sources'
    names and bytes, `inputs` (e.g. headers), the flags, the compiler's version and the CPU; a filelock guards
    concurrent builds. Each of `flag_sets` is tried in turn until one compiles."""
    from filelock import FileLock

    src = b"".join(Path(p).name.encode() + b"\0" + Path(p).read_bytes() for p in sources)
    src += (b"\0" + inputs) if inputs else b""
    last_err = ""
    for flags in flag_sets:
        key = hashlib.sha256(b"\0".join([src, " ".join(flags).encode(), _version(cxx).encode(),
                                          platform.machine().encode(), _cpu_id().encode()])).hexdigest()[:16]
        lib = out_dir / f"{stem}-{key}.so"
        if lib.exists():
            return lib
        out_dir.mkdir(parents=True, exist_ok=True)
        with FileLock(str(lib) + ".lock"):
            if lib.exists():
                return lib
            fd, tmp = tempfile.mkstemp(suffix=".so", dir=out_dir)
            os.close(fd)
            try:
                proc = subprocess.run([cxx, *flags, "-o", tmp, *map(str, sources)], capture_output=True, text=True,
                                      timeout=COMPILE_TIMEOUT_S)
                if proc.returncode == 0:
                    os.replace(tmp, lib)
                    return lib
                lines = (proc.stderr or proc.stdout).strip().splitlines()
                last_err = ([ln for ln in lines if "error" in ln] or lines or [f"exit status {proc.returncode}"])[0]
            except subprocess.TimeoutExpired:
                last_err = f"no result after {COMPILE_TIMEOUT_S} s"
            finally:
                if os.path.exists(tmp):
                    os.unlink(tmp)
    raise HostKernelsUnavailable(f"{cxx} could not build {', '.join(Path(p).name for p in sources)}: {last_err}")


def bind(path: Path):
    lib = ctypes.CDLL(str(path))   # CDLL calls release the GIL: the pool's threads run in parallel
    fn = lib.llama_npu_attention
    fn.argtypes = [_FP] * 4 + [ctypes.c_int] * 6 + [ctypes.c_float] + [ctypes.c_int] * 3
    fn.restype = ctypes.c_int
    lib.llama_npu_attention_pack.argtypes = [_FP, _FP] + [ctypes.c_int] * 4 + [_FP, _FP]
    lib.llama_npu_attention_pack.restype = ctypes.c_int
    lib.llama_npu_attention_vector_path.restype = ctypes.c_int
    gemv = lib.llama_npu_gemv_bf16
    gemv.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_int] * 4
    gemv.restype = ctypes.c_int
    for q in (lib.llama_npu_gemv_q4, lib.llama_npu_gemv_q8):
        q.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_int] * 7
        q.restype = ctypes.c_int
    lib.llama_npu_dequant_q4.argtypes = [ctypes.c_void_p] * 2 + [ctypes.c_int] * 8
    lib.llama_npu_dequant_q4.restype = ctypes.c_int
    lib.llama_npu_gemv_bfp.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_int] * 4
    lib.llama_npu_gemv_bfp.restype = ctypes.c_int
    return lib


def library():
    """The loaded library of every host kernel, or None (the numpy paths): built on first use."""
    with _lock:
        if "lib" in _state:
            return _state["lib"]
        lib, why = None, ""
        if os.environ.get("LLAMA_NPU_HOST_KERNELS", "").lower() == "numpy":
            why = "LLAMA_NPU_HOST_KERNELS=numpy"
        elif (cxx := compiler()) is None:
            why = "no C++ compiler (g++/c++/clang++, or $CXX) found"
        else:
            try:
                lib = bind(build(cxx, cache_root() / "host"))
            except (HostKernelsUnavailable, OSError, RuntimeError) as e:   # RuntimeError: no home directory
                why = str(e)
        if lib is None and why != "LLAMA_NPU_HOST_KERNELS=numpy":
            print(f"llama-npu: emulated attention and GEMVs use the slower numpy paths: {why}", file=sys.stderr)
        _state["lib"] = lib
        return lib
