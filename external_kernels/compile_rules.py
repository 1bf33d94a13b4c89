"""How an external C++ kernel is compiled: Peano (llvm-aie) for the AIE2P vector path, the host C++ compiler
for the portable scalar path the tests check, and the fingerprint that keys a compiled object."""
from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass
from pathlib import Path

from external_kernels.paths import SOURCE_DIR

# Flags shared by every Peano compile. -D__AIE_API_AIE_ADF_HPP__ keeps aie_api from pulling in the ADF graph
# headers (not shipped with mlir-aie); -DNDEBUG drops aie_api's runtime checks. The warnings silenced are the
# ones aie_api itself triggers under clang.
PEANO_TARGET = "aie2p-none-unknown-elf"
PEANO_FLAGS: tuple[str, ...] = (
    f"--target={PEANO_TARGET}",
    "-O2",
    "-std=c++20",
    "-DNDEBUG",
    "-D__AIE_API_AIE_ADF_HPP__",
    "-Wno-parentheses",
    "-Wno-attributes",
    "-Wno-macro-redefined",
    "-Wno-empty-body",
)
# Host (scalar-path) flags: position independent so the objects can be linked into a shared library for ctypes.
HOST_FLAGS: tuple[str, ...] = ("-O2", "-std=c++20", "-fPIC", "-DLLAMA_NPU_HOST")


@dataclass(frozen=True)
class ExternalKernel:
    """One `extern "C"` function: its symbol, the object file holding it, its source and -D defines."""

    symbol: str
    obj: str
    source: str  # file name inside external_kernels/
    defines: tuple[tuple[str, str], ...]

    @property
    def source_path(self) -> Path:
        return SOURCE_DIR / self.source

    def define_flags(self) -> list[str]:
        return [f"-D{name}={value}" for name, value in self.defines]


def aie_include_dir_from_env() -> Path | None:
    """mlir-aie's include dir (holds aie_api/): $MLIR_AIE_INSTALL_DIR/include, like the mlir-air Makefiles."""
    root = os.environ.get("MLIR_AIE_INSTALL_DIR")
    return Path(root) / "include" if root else None


def compile_command(kernel: ExternalKernel, out_dir: Path, peano_dir: Path,
                    aie_include_dir: Path | None = None) -> list[str]:
    """Peano command building `kernel.obj` in out_dir from its source with its -D flags.

    aie_include_dir: directory containing `aie_api/aie.hpp` (mlir-aie install `include/`); defaults to
    $MLIR_AIE_INSTALL_DIR/include when set. Peano's own clang ships the AIE intrinsics; aie_api comes with mlir-aie.
    """
    cmd = [str(Path(peano_dir) / "bin" / "clang++"), *PEANO_FLAGS]
    include = aie_include_dir if aie_include_dir is not None else aie_include_dir_from_env()
    if include is not None:
        cmd.append(f"-I{include}")
    cmd += [f"-I{SOURCE_DIR}", "-c", str(kernel.source_path), "-o", str(Path(out_dir) / kernel.obj)]
    cmd += kernel.define_flags()
    return cmd


def host_object_name(kernel: ExternalKernel) -> str:
    return kernel.obj[:-2] + ".host.o" if kernel.obj.endswith(".o") else kernel.obj + ".host.o"


def host_compile_command(kernel: ExternalKernel, out_dir: Path, cxx: str = "g++") -> list[str]:
    """Host compile of the scalar path (no __AIENGINE__) into `<obj stem>.host.o`, position independent."""
    return [cxx, *HOST_FLAGS, f"-I{SOURCE_DIR}", "-c", str(kernel.source_path),
            "-o", str(Path(out_dir) / host_object_name(kernel)), *kernel.define_flags()]


def host_link_command(objects: list[Path], out_path: Path, cxx: str = "g++") -> list[str]:
    """Link host objects into one shared library (loaded with ctypes by the tests)."""
    return [cxx, "-shared", "-o", str(out_path), *map(str, objects)]


def _headers() -> list[Path]:
    return sorted(SOURCE_DIR.glob("*.h"))


def included_sources(source: Path) -> list[Path]:
    """The .cc files `source` includes by name (`#include "gemm.cc"`: gemm_q4.cc), found as the compiler finds
    them: beside it, else in SOURCE_DIR (the -I of every compile; a mutated copy elsewhere includes the sources):
    a build's inputs besides its own text and the headers. An include may sit indented (in a namespace)."""
    names = re.findall(r'^\s*#include "([\w.]+\.cc)"', Path(source).read_text(), re.M)
    return [Path(source).parent / n if (Path(source).parent / n).exists() else SOURCE_DIR / n for n in names]


def kernel_fingerprint(kernel: ExternalKernel) -> str:
    """sha256 over the source, every shared header, the defines and the Peano flags (build cache key)."""
    h = hashlib.sha256()
    for path in [kernel.source_path, *included_sources(kernel.source_path), *_headers()]:
        h.update(path.name.encode() + b"\0")
        h.update(path.read_bytes())
        h.update(b"\0")
    for name, value in kernel.defines:
        h.update(f"-D{name}={value}\0".encode())
    for flag in PEANO_FLAGS:
        h.update(flag.encode() + b"\0")
    return h.hexdigest()
