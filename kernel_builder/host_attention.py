"""The emulator's attention on the host CPU: kernel_builder/host_kernels/attention_host.cc, built once per
machine with the host C++ compiler and called through ctypes on a small thread pool.

Why: attention is the one emulated kernel whose work grows with the square of the prompt. numpy has no
fixed-order f32 product (BLAS picks its summation order by matrix shape), so the numpy path
(`reference.attention_numpy`) computes the products in f64 to keep a row's result independent of the chunk
it runs in; at 2k-8k tokens that made attention half or more of an emulated prefill. The C++ kernel does the
arithmetic in f32 in one fixed order per output element (see the comment at the top of the .cc), so a row
still gives the same bits in any chunk and in decode, at several times the speed, on every core.

The library is cached under `<cache root>/host/` keyed by the source, the flags and the compiler's version
(a filelock guards concurrent builds). Without a compiler, or with LLAMA_NPU_HOST_ATTENTION=numpy, the numpy
path runs instead (a one-line notice says so); both agree within bf16 rounding (tested), each is
deterministic on its own. Prefill-sized calls run on kernel_builder.host_threads' pool.
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

import numpy as np

from kernel_builder.host_threads import run_items
from kernel_builder.paths import cache_root

SOURCE = Path(__file__).resolve().parent / "host_kernels" / "attention_host.cc"
# -ffp-contract=off: every fma in the kernel is written out; the compiler must not fuse a mul and an add on
# its own (it would do so in one loop and not in another, and rows would depend on the path they took).
FLAGS: tuple[str, ...] = ("-O3", "-std=c++17", "-fPIC", "-shared", "-ffp-contract=off")
NATIVE_FLAGS: tuple[str, ...] = ("-march=native",)
KEY_TILE = 16       # kv rows are padded to a multiple of this (the kernel's score tile)
ROW_BLOCK = 64      # query rows per work item on the thread pool
PARALLEL_MIN_WORK = 1 << 22   # query rows x keys x query heads below which one thread does it all
COMPILE_TIMEOUT_S = 300

_FP = ctypes.POINTER(ctypes.c_float)
_lock = threading.Lock()
_state: dict = {}


def _after_fork() -> None:          # a child must not inherit a lock held by a thread that is not there
    global _lock
    _lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork)


class HostAttentionUnavailable(RuntimeError):
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
    """Compile the kernel into out_dir (once: the file name holds a hash of everything that goes in) and
    return the library path. Tries -march=native first (the AVX2 path on x86), then without it."""
    from filelock import FileLock

    src = SOURCE.read_bytes()
    last_err = ""
    for native in (NATIVE_FLAGS, ()):
        flags = FLAGS + native + extra
        key = hashlib.sha256(b"\0".join([src, " ".join(flags).encode(), _version(cxx).encode(),
                                          platform.machine().encode(), _cpu_id().encode()])).hexdigest()[:16]
        lib = out_dir / f"attention_host-{key}.so"
        if lib.exists():
            return lib
        out_dir.mkdir(parents=True, exist_ok=True)
        with FileLock(str(lib) + ".lock"):
            if lib.exists():
                return lib
            fd, tmp = tempfile.mkstemp(suffix=".so", dir=out_dir)
            os.close(fd)
            try:
                proc = subprocess.run([cxx, *flags, "-o", tmp, str(SOURCE)], capture_output=True, text=True,
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
    raise HostAttentionUnavailable(f"{cxx} could not build {SOURCE.name}: {last_err}")


def bind(path: Path):
    lib = ctypes.CDLL(str(path))   # CDLL calls release the GIL: the pool's threads run in parallel
    fn = lib.llama_npu_attention
    fn.argtypes = [_FP] * 4 + [ctypes.c_int] * 6 + [ctypes.c_float] + [ctypes.c_int] * 3
    fn.restype = ctypes.c_int
    lib.llama_npu_attention_pack.argtypes = [_FP, _FP] + [ctypes.c_int] * 4 + [_FP, _FP]
    lib.llama_npu_attention_pack.restype = ctypes.c_int
    lib.llama_npu_attention_vector_path.restype = ctypes.c_int
    return lib


def library():
    """The loaded kernel library, or None (numpy path): built on first use."""
    with _lock:
        if "lib" in _state:
            return _state["lib"]
        lib, why = None, ""
        if os.environ.get("LLAMA_NPU_HOST_ATTENTION", "").lower() == "numpy":
            why = "LLAMA_NPU_HOST_ATTENTION=numpy"
        elif (cxx := compiler()) is None:
            why = "no C++ compiler (g++/c++/clang++, or $CXX) found"
        else:
            try:
                lib = bind(build(cxx, cache_root() / "host"))
            except (HostAttentionUnavailable, OSError, RuntimeError) as e:   # RuntimeError: no home directory
                why = str(e)
        if lib is None and why != "LLAMA_NPU_HOST_ATTENTION=numpy":
            print(f"llama-npu: emulated attention uses the slower numpy path: {why}", file=sys.stderr)
        _state["lib"] = lib
        return lib


def run(lib, qf: np.ndarray, k: np.ndarray, v: np.ndarray, p: int, *, rows: int, heads: int, kv_heads: int,
        head_dim: int, scale: float) -> np.ndarray:
    """f32 attention output [rows, heads*head_dim]. qf: f32 [rows, heads*head_dim]; k, v: [>= p+rows,
    kv_heads*head_dim] (bf16 or f32); the caller has checked the shapes."""
    n = p + rows
    npad = -(-n // KEY_TILE) * KEY_TILE
    kt = np.empty((kv_heads, npad // KEY_TILE, head_dim, KEY_TILE), dtype=np.float32)   # the kernel's layouts
    vt = np.empty((kv_heads, head_dim // KEY_TILE, npad, KEY_TILE), dtype=np.float32)
    kn, vn = (np.ascontiguousarray(x[:n], dtype=np.float32) for x in (k, v))
    if lib.llama_npu_attention_pack(*(a.ctypes.data_as(_FP) for a in (kn, vn)), n, kv_heads, head_dim, npad,
                                    *(a.ctypes.data_as(_FP) for a in (kt, vt))):
        raise ValueError(f"attention: the host kernel refused the K/V shapes ({n} positions, {kv_heads} kv heads, "
                         f"head_dim {head_dim})")
    q = np.ascontiguousarray(qf, dtype=np.float32)
    out = np.empty((rows, heads * head_dim), dtype=np.float32)
    args = [a.ctypes.data_as(_FP) for a in (q, kt, vt, out)]
    # later rows see more keys: hand them out first so the workers finish together
    items = [(h, r0, min(rows, r0 + ROW_BLOCK)) for r0 in reversed(range(0, rows, ROW_BLOCK))
             for h in range(kv_heads)]

    def one(item):
        h, r0, r1 = item
        rc = lib.llama_npu_attention(*args, rows, p, heads, kv_heads, head_dim, npad, scale, h, r0, r1)
        if rc == -1:
            raise MemoryError(f"attention: the host kernel could not allocate its {npad}-key work buffer")
        if rc:
            raise ValueError(f"attention: the host kernel refused the shapes (rows {rows}, position {p}, heads "
                             f"{heads}/{kv_heads}, head_dim {head_dim}, kv head {h}, rows {r0}..{r1})")

    run_items(one, items, parallel=rows * n * heads >= PARALLEL_MIN_WORK)
    return out
