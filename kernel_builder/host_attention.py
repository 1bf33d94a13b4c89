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
deterministic on its own. LLAMA_NPU_EMU_THREADS sets the worker count (default: the machine's cores, at
most 8; 1 runs on the calling thread).
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
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from kernel_builder.paths import cache_root

SOURCE = Path(__file__).resolve().parent / "host_kernels" / "attention_host.cc"
# -ffp-contract=off: every fma in the kernel is written out; the compiler must not fuse a mul and an add on
# its own (it would do so in one loop and not in another, and rows would depend on the path they took).
FLAGS: tuple[str, ...] = ("-O3", "-std=c++17", "-fPIC", "-shared", "-ffp-contract=off")
NATIVE_FLAGS: tuple[str, ...] = ("-march=native",)
KEY_TILE = 16       # kv rows are padded to a multiple of this (the kernel's score tile)
ROW_BLOCK = 64      # query rows per work item on the thread pool
PARALLEL_MIN_WORK = 1 << 22   # query rows x keys x query heads below which one thread does it all

_lock = threading.Lock()
_state: dict = {}


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


def build(cxx: str, out_dir: Path, extra: tuple[str, ...] = ()) -> Path:
    """Compile the kernel into out_dir (once: the file name holds a hash of everything that goes in) and
    return the library path. Tries -march=native first (the AVX2 path on x86), then without it."""
    from filelock import FileLock

    src = SOURCE.read_bytes()
    last_err = ""
    for native in (NATIVE_FLAGS, ()):
        flags = FLAGS + native + extra
        key = hashlib.sha256(b"\0".join([src, " ".join(flags).encode(), _version(cxx).encode(),
                                          platform.machine().encode()])).hexdigest()[:16]
        lib = out_dir / f"attention_host-{key}.so"
        if lib.exists():
            return lib
        out_dir.mkdir(parents=True, exist_ok=True)
        with FileLock(str(lib) + ".lock"):
            if lib.exists():
                return lib
            fd, tmp = tempfile.mkstemp(suffix=".so", dir=out_dir)
            os.close(fd)
            proc = subprocess.run([cxx, *flags, "-o", tmp, str(SOURCE)], capture_output=True, text=True)
            if proc.returncode == 0:
                os.replace(tmp, lib)
                return lib
            os.unlink(tmp)
            last_err = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or [""]
            last_err = last_err[0]
    raise HostAttentionUnavailable(f"{cxx} could not build {SOURCE.name}: {last_err}")


def bind(path: Path):
    lib = ctypes.CDLL(str(path))   # CDLL calls release the GIL: the pool's threads run in parallel
    fn = lib.llama_npu_attention
    fp = ctypes.POINTER(ctypes.c_float)
    fn.argtypes = [fp, fp, fp, fp] + [ctypes.c_int] * 6 + [ctypes.c_float] + [ctypes.c_int] * 3
    fn.restype = ctypes.c_int
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
            except (HostAttentionUnavailable, OSError) as e:
                why = str(e)
        if lib is None and why != "LLAMA_NPU_HOST_ATTENTION=numpy":
            print(f"llama-npu: emulated attention uses the slower numpy path: {why}", file=sys.stderr)
        _state["lib"] = lib
        return lib


def threads() -> int:
    env = os.environ.get("LLAMA_NPU_EMU_THREADS")
    if env:
        try:
            return max(1, int(env))
        except ValueError:
            raise ValueError(f"LLAMA_NPU_EMU_THREADS={env!r} is not a number") from None
    return max(1, min(8, os.cpu_count() or 1))


def _pool(n: int) -> ThreadPoolExecutor:
    with _lock:
        pool = _state.get("pool")
        if pool is None or pool._max_workers != n:
            pool = _state["pool"] = ThreadPoolExecutor(max_workers=n, thread_name_prefix="llama-npu-attn")
        return pool


def run(lib, qf: np.ndarray, k: np.ndarray, v: np.ndarray, p: int, *, rows: int, heads: int, kv_heads: int,
        head_dim: int, scale: float) -> np.ndarray:
    """f32 attention output [rows, heads*head_dim]. qf: f32 [rows, heads*head_dim]; k, v: [>= p+rows,
    kv_heads*head_dim] (bf16 or f32); the caller has checked the shapes."""
    n = p + rows
    npad = -(-n // KEY_TILE) * KEY_TILE
    t = KEY_TILE   # the kernel's layouts: keys in tiles of 16, transposed; values in 16-column slices
    kp = np.zeros((npad, kv_heads, head_dim), dtype=np.float32)
    kp[:n] = k[:n].reshape(n, kv_heads, head_dim)
    kt = np.ascontiguousarray(kp.reshape(npad // t, t, kv_heads, head_dim).transpose(2, 0, 3, 1))
    vp = np.zeros((npad, kv_heads, head_dim), dtype=np.float32)
    vp[:n] = v[:n].reshape(n, kv_heads, head_dim)
    vv = np.ascontiguousarray(vp.reshape(npad, kv_heads, head_dim // t, t).transpose(1, 2, 0, 3))
    q = np.ascontiguousarray(qf, dtype=np.float32)
    out = np.empty((rows, heads * head_dim), dtype=np.float32)
    fp = ctypes.POINTER(ctypes.c_float)
    args = [a.ctypes.data_as(fp) for a in (q, kt, vv, out)]
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

    nthreads = threads()
    if nthreads == 1 or len(items) == 1 or rows * n * heads < PARALLEL_MIN_WORK:
        for item in items:
            one(item)
    else:
        list(_pool(nthreads).map(one, items))
    return out
