"""The external kernels' AIE2P vector path (`__AIENGINE__`), compiled with the host C++ compiler against the host
aie_api (external_kernels/aie_api_host/, docs/aie-api-host.md) and called through ctypes, with the instruction
counts of each call.

One shared library per kernel object (an `ExternalKernel`: its source and -D shape flags), cached under
`<cache root>/aie_host/` by external_kernels.host_build.build_library (the name hashes the source, the shared
headers, the host aie_api headers, the flags and the compiler). A source override (a mutated copy in a test)
is compiled the same way.

    lib = load(gemm_kernels(64, 64, 64).zero)
    counts = lib.call("gemm_mac_bf16_m64_k64_n64", a, w, acc)    # numpy arrays -> pointers; ints -> int32
    counts["mmul_bfp16_8x8x8"]                                     # 512

Arrays passed to a call must meet the AIE2P alignment of the vector accesses the kernel makes (64 bytes covers
every one): `aligned()` copies an array into such a buffer. A misaligned access, like any other error the host
aie_api detects, raises AieHostError after the call.
"""
from __future__ import annotations

import ctypes
import subprocess
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from external_kernels.compile_rules import ExternalKernel, included_sources
from external_kernels.host_build import HostKernelsUnavailable, build_library, compiler
from external_kernels.paths import SOURCE_DIR, cache_root

API_DIR = Path(__file__).resolve().parent.parent / "external_kernels" / "aie_api_host"
# -ffp-contract=off: no mul+add fusion the chip would not do; -D__AIENGINE__ selects the kernels' AIE2P path.
FLAGS: tuple[str, ...] = ("-O1", "-std=c++20", "-fPIC", "-shared", "-ffp-contract=off", "-D__AIENGINE__",
                          "-Wall", "-Wno-unused-function")
ALIGN = 64   # bytes: the widest AIE2P vector alignment (aie_api detail/ld_st.hpp)


class AieHostError(RuntimeError):
    """An error the host aie_api reported during a kernel call (e.g. a misaligned vector load)."""


def api_headers() -> list[Path]:
    return sorted(API_DIR.rglob("*.hpp"))


def compile_flags(kernel: ExternalKernel | None, defines: tuple[str, ...] = ()) -> list[str]:
    own = kernel.define_flags() if kernel is not None else []
    return [*FLAGS, f"-I{API_DIR}", f"-I{SOURCE_DIR}", *own, *defines]


def _inputs(source_dir: Path = SOURCE_DIR) -> bytes:
    """The headers a build reads besides its source: the shared ones, aie_api's, and those beside a source
    outside external_kernels (a mutated copy's `#include "..."` finds them first)."""
    beside = sorted(source_dir.glob("*.h")) if source_dir.resolve() != SOURCE_DIR.resolve() else []
    paths = [*sorted(SOURCE_DIR.glob("*.h")), *api_headers(), *beside]
    return b"".join(p.name.encode() + b"\0" + p.read_bytes() for p in paths)


def build(kernel: ExternalKernel, source: Path | None = None, defines: tuple[str, ...] = ()) -> Path:
    """Path of the cached shared library of `kernel`'s vector path (built on first use)."""
    cxx = compiler()
    if cxx is None:
        raise HostKernelsUnavailable("no C++ compiler (g++/c++/clang++, or $CXX) found")
    src = Path(source) if source is not None else kernel.source_path
    stem = kernel.obj[:-2] if kernel.obj.endswith(".o") else kernel.obj
    included = b"".join(p.name.encode() + b"\0" + p.read_bytes() for p in included_sources(src))
    return build_library(cxx, cache_root() / "aie_host", stem, [src], [compile_flags(kernel, defines)],
                         _inputs(src.parent) + included)


def compile_errors(kernel: ExternalKernel | None, source: Path, defines: tuple[str, ...] = ()) -> str:
    """Compile `source` (syntax and templates only, nothing cached) and return the compiler's stderr ('' when it
    compiles): how a test shows that a construct is rejected."""
    cxx = compiler()
    if cxx is None:
        raise HostKernelsUnavailable("no C++ compiler (g++/c++/clang++, or $CXX) found")
    cmd = [cxx, *compile_flags(kernel, defines), "-fsyntax-only", str(source)]
    proc = subprocess.run([c for c in cmd if c != "-shared"], capture_output=True, text=True, timeout=300)
    return proc.stderr if proc.returncode else ""


class AieHostLibrary:
    """One kernel object's vector path, loaded."""

    def __init__(self, path: Path):
        self.path = path
        self.lib = ctypes.CDLL(str(path))
        self.lib.aie_host_kind_name.restype = ctypes.c_char_p
        self.lib.aie_host_count.restype = ctypes.c_ulonglong
        self.lib.aie_host_error.restype = ctypes.c_char_p
        self.kinds = [self.lib.aie_host_kind_name(i).decode() for i in range(self.lib.aie_host_kinds())]

    def counts(self) -> dict[str, int]:
        return {name: int(self.lib.aie_host_count(i)) for i, name in enumerate(self.kinds)}

    def call(self, symbol: str, *args) -> dict[str, int]:
        """Call `symbol` (numpy arrays as pointers, Python ints as int32, floats as f32) and return the counts of
        this call. Raises AieHostError when the host aie_api reported an error."""
        fn = getattr(self.lib, symbol)
        fn.restype = None
        c_args = []
        for a in args:
            if isinstance(a, np.ndarray):
                if not a.flags.c_contiguous:
                    raise ValueError(f"{symbol}: array arguments must be C-contiguous")
                c_args.append(ctypes.c_void_p(a.ctypes.data))
            elif isinstance(a, (bool, np.bool_)):
                raise TypeError(f"{symbol}: bool argument {a!r}")
            elif isinstance(a, (int, np.integer)):
                c_args.append(ctypes.c_int32(int(a)))
            elif isinstance(a, (float, np.floating)):
                c_args.append(ctypes.c_float(float(a)))
            else:
                raise TypeError(f"{symbol}: unsupported argument type {type(a).__name__}")
        self.lib.aie_host_reset()
        fn(*c_args)
        err = self.lib.aie_host_error().decode()
        if err:
            raise AieHostError(f"{symbol}: {err}")
        return self.counts()


_loaded: dict[Path, AieHostLibrary] = {}


def load(kernel: ExternalKernel, source: Path | None = None,
         defines: tuple[str, ...] = ()) -> AieHostLibrary:
    path = build(kernel, source, defines)
    if path not in _loaded:
        _loaded[path] = AieHostLibrary(path)
    return _loaded[path]


def build_all(kernels, workers: int = 2) -> list[Path]:
    """Build several kernels' libraries in parallel (the machine's cores), in order."""
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(build, kernels))


def aligned(a: np.ndarray, offset: int = 0) -> np.ndarray:
    """A C-contiguous copy of `a` whose data starts `offset` bytes past a 64-byte boundary (offset 0: aligned for
    every AIE2P vector access; a non-zero offset makes a deliberately misaligned buffer)."""
    a = np.asarray(a)
    raw = np.empty(a.nbytes + 2 * ALIGN, dtype=np.uint8)
    start = (-raw.ctypes.data) % ALIGN + offset
    out = raw[start:start + a.nbytes].view(a.dtype).reshape(a.shape)
    out[...] = a
    return out


@dataclass
class Run:
    """One checked call on the host aie_api (the drivers of kernel_builder/aie_host_runs*.py): what the kernel
    wrote, the reference, the per-element bound and the instruction counts of one call."""

    got: np.ndarray
    want: np.ndarray
    bound: np.ndarray
    counts: dict
