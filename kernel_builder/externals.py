"""Registry of the external C++ kernels (external_kernels/*.cc) and their compile rules.

Each ExternalKernel names one `extern "C"` symbol inside one object file. One .cc source is compiled
several times with different -D shape flags; every shape gets its own symbol and object name (e.g.
`mv_bf16_k2048_c2048_m4_r256` in `mv_k2048_c2048_m4_r256.o` next to
`mv_bf16_k8192_c1024_m8_r256` in `mv_k8192_c1024_m8_r256.o`), so variants can be
linked into one multi-launch module without clashing.

Two compilers:
- Peano (llvm-aie) for the NPU: `compile_command()` — the AIE2P vector path (`__AIENGINE__` is defined by
  the aie2p target). It needs the aie_api headers shipped with mlir-aie (`<mlir-aie install>/include`).
- the host C++ compiler for tests: `host_compile_command()` — the portable scalar path (`#else` branch),
  same symbols, used to check the C++ against kernel_builder.reference.
"""
from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, NamedTuple

from external_kernels.paths import SOURCE_DIR
from kernel_builder.reference import attention_scale

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

# Vector-path granularity: the AIE2P kernels work on 32-lane bf16 vectors (16 lanes for the RoPE halves), so
# shapes must be multiples of these. Checked here so a bad shape fails at build time with a clear message.
GEMV_K_MULTIPLE = 32
ROPE_HEAD_DIM_MULTIPLE = 32
SWIGLU_N_MULTIPLE = 32
RMSNORM_GROUP_MULTIPLE = 32
ADD_N_MULTIPLE = 32
ATTN_HEAD_DIM_MULTIPLE = 32
ATTN_LK_MULTIPLE = 16
ATTN_LQ_MULTIPLE = 8     # prefill query rows: whole mmul blocks
ATTN_MAX_PARTS = 16      # decode merge: partial states combined in one 16-lane vector
GEMM_M_MULTIPLE = 8    # 8x8 blocks
GEMM_K_MULTIPLE = 8
GEMM_N_MULTIPLE = 16   # two 8-column blocks per mmul step


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


class AttentionKernels(NamedTuple):
    """The tile primitives of one attention configuration; they share one object file (one compile).
    Prefill: (init, item, finish); decode: (init, step, merge)."""

    init: ExternalKernel
    update: ExternalKernel
    out: ExternalKernel

    @property
    def obj(self) -> str:
        return self.init.obj


class GemmKernels(NamedTuple):
    """The GEMM micro-kernel's three entry points; they share one object file (one compile per tile)."""

    zero: ExternalKernel
    mac: ExternalKernel
    out: ExternalKernel

    @property
    def obj(self) -> str:
        return self.zero.obj


def _positive(kernel: str, **dims: int) -> None:
    for name, value in dims.items():
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise ValueError(f"{kernel}: {name} must be a positive int, got {value!r}")


def _multiple(kernel: str, name: str, value: int, multiple: int) -> None:
    if value % multiple:
        raise ValueError(
            f"{kernel}: {name}={value} must be a multiple of {multiple} (AIE2P vector width of the kernel)")


def gemv_kernel(k: int, kc: int, tile_m: int, rows: int) -> ExternalKernel:
    """One GEMV step of a herd tile: rows [row, row+tile_m) of its `rows` outputs, K chunk [k0, k0+kc):
    `(w[tile_m][kc], x[k], acc[tile_m] f32, y[rows], int32 row, int32 k0)` (x whole: the step reads
    x[k0, k0+kc)); partial sums carried in `acc` across the k/kc chunks, the last chunk writes bf16 RNE into y.
    f32 accumulation."""
    _positive("gemv", k=k, kc=kc, tile_m=tile_m, rows=rows)
    _multiple("gemv", "k", k, GEMV_K_MULTIPLE)
    _multiple("gemv", "kc", kc, GEMV_K_MULTIPLE)
    if k % kc:
        raise ValueError(f"gemv: kc={kc} must divide k={k}")
    if rows % tile_m:
        raise ValueError(f"gemv: tile_m={tile_m} must divide rows={rows}")
    tag = f"k{k}_c{kc}_m{tile_m}_r{rows}"
    symbol = f"mv_bf16_{tag}"
    return ExternalKernel(
        symbol=symbol,
        obj=f"mv_{tag}.o",
        source="gemv.cc",
        defines=(("GEMV_K", str(k)), ("GEMV_KC", str(kc)), ("GEMV_TILE_M", str(tile_m)), ("GEMV_ROWS", str(rows)),
                 ("GEMV_SYMBOL", symbol)),
    )


def rmsnorm_kernel(group: int, units: int) -> ExternalKernel:
    """RMSNorm of `units` consecutive groups of `group` elements with one weight: `(x[units*group],
    w[group], y[units*group], f32 eps)`; the mean multiplies by 1/group (no run-time division)."""
    _positive("rmsnorm", group=group, units=units)
    _multiple("rmsnorm", "group", group, RMSNORM_GROUP_MULTIPLE)
    tag = f"g{group}_u{units}"
    symbol = f"rmsnorm_bf16_{tag}"
    return ExternalKernel(
        symbol=symbol,
        obj=f"rmsnorm_{tag}.o",
        source="rmsnorm.cc",
        defines=(("RMSNORM_GROUP", str(group)), ("RMSNORM_UNITS", str(units)), ("RMSNORM_SYMBOL", symbol)),
    )


def add_kernel(n: int) -> ExternalKernel:
    """y[n] = a[n] + b[n] (f32 add, bf16 RNE)."""
    _positive("add", n=n)
    _multiple("add", "n", n, ADD_N_MULTIPLE)
    symbol = f"add_bf16_n{n}"
    return ExternalKernel(symbol=symbol, obj=f"add_n{n}.o", source="add.cc",
                          defines=(("ADD_N", str(n)), ("ADD_SYMBOL", symbol)))


def rope_kernel(head_dim: int, heads: int, rows: int = 1) -> ExternalKernel:
    """Half-split RoPE of `rows` position rows x `heads` heads: `(x[rows][heads*head_dim],
    lut[rows][head_dim] = [cos | sin], y like x)`. The L1 types depend on all three, so the symbol does."""
    _positive("rope", head_dim=head_dim, heads=heads, rows=rows)
    _multiple("rope", "head_dim", head_dim, ROPE_HEAD_DIM_MULTIPLE)
    tag = f"hd{head_dim}_h{heads}_r{rows}"
    symbol = f"rope_bf16_{tag}"
    return ExternalKernel(
        symbol=symbol,
        obj=f"rope_{tag}.o",
        source="rope.cc",
        defines=(("ROPE_HEAD_DIM", str(head_dim)), ("ROPE_HEADS", str(heads)), ("ROPE_ROWS", str(rows)),
                 ("ROPE_SYMBOL", symbol)),
    )


def swiglu_kernel(n: int) -> ExternalKernel:
    """y[n] = silu(gate[n]) * up[n] in f32, bf16 RNE output."""
    _positive("swiglu", n=n)
    _multiple("swiglu", "n", n, SWIGLU_N_MULTIPLE)
    symbol = f"swiglu_bf16_n{n}"
    return ExternalKernel(
        symbol=symbol,
        obj=f"swiglu_n{n}.o",
        source="swiglu.cc",
        defines=(("SWIGLU_N", str(n)), ("SWIGLU_SYMBOL", symbol)),
    )


def _attention(mode: str, head_dim: int, lq: int, lk: int, n_parts: int = 0) -> AttentionKernels:
    kind = "prefill" if mode == "p" else "decode"
    _positive(f"attention {kind}", head_dim=head_dim, lq=lq, lk=lk)
    _multiple("attention", "head_dim", head_dim, ATTN_HEAD_DIM_MULTIPLE)
    _multiple("attention", "lk", lk, ATTN_LK_MULTIPLE)
    if mode == "p":
        _multiple("attention", "lq", lq, ATTN_LQ_MULTIPLE)
        if not lk <= lq <= 2 * lk:
            raise ValueError(f"attention: lq={lq} must lie in [lk, 2*lk] = [{lk}, {2 * lk}] (a Q tile travels in "
                             f"one item as two lk-row halves)")
        parts, tag = ("init", "item", "finish"), f"hd{head_dim}_q{lq}_k{lk}"
    else:
        _positive("attention decode", n_parts=n_parts)
        if n_parts > ATTN_MAX_PARTS:
            raise ValueError(f"attention: n_parts={n_parts} exceeds {ATTN_MAX_PARTS} (one 16-lane merge vector)")
        parts, tag = ("init", "step", "merge"), f"hd{head_dim}_q{lq}_k{lk}_n{n_parts}"
    syms = [f"attn{mode}_{part}_bf16_{tag}" for part in parts]
    defines = (
        ("ATTN_MODE", "1" if mode == "p" else "2"),
        ("ATTN_HEAD_DIM", str(head_dim)),
        ("ATTN_LQ", str(lq)),
        ("ATTN_LK", str(lk)),
        *((("ATTN_NPARTS", str(n_parts)),) if mode == "d" else ()),
        # f32 bits of 1/sqrt(head_dim) as a C hex-float literal: the C++ and the numpy reference use the same scale.
        ("ATTN_SCALE", float.hex(attention_scale(head_dim)) + "f"),
        ("ATTN_INIT_SYMBOL", syms[0]),
        ("ATTN_UPDATE_SYMBOL", syms[1]),
        ("ATTN_OUT_SYMBOL", syms[2]),
    )
    obj = f"attn{mode}_{tag}.o"
    return AttentionKernels(*(ExternalKernel(symbol=s_, obj=obj, source="attention.cc", defines=defines)
                              for s_ in syms))


def attention_prefill_kernels(head_dim: int, lq: int, lk: int) -> AttentionKernels:
    """Prefill tile primitives for [lq, head_dim] query tiles and items of 2*lk rows (kernels/attention.py):

    init(state f32[lq*(hd+2)])
    item(item bf16[2*lk*hd], q bf16[lq*hd], state, int32 t, int32 n_q, int32 slot, int32 q_pos0)
        (slot = 2 * the Q item holding the core's tile + the half it starts in)
    finish(state, out bf16[lq*hd])
    """
    return _attention("p", head_dim, lq, lk)


def attention_decode_kernels(head_dim: int, lq: int, lk: int, n_parts: int) -> AttentionKernels:
    """Decode tile primitives for the lq query rows of one GQA group, K/V tiles of lk rows and a merge of
    n_parts partial states:

    init(state f32[lq*(hd+2)])
    step(item bf16[(2*lk+lq)*hd], state, int32 pos, int32 k_pos0)
    merge(parts f32[n_parts*lq*(hd+2)], out bf16[lq*hd])
    """
    return _attention("d", head_dim, lq, lk, n_parts)


def gemm_kernels(tile_m: int, tile_k: int, tile_n: int) -> GemmKernels:
    """One compute tile's GEMM step on 8x8-blocked L1 buffers (layouts in external_kernels/gemm.cc):

    zero(acc[tile_m*tile_n] f32)
    mac(a[tile_m*tile_k] bf16, w[tile_n*tile_k] bf16, acc)   acc += a . w^T (w rows = output columns)
    out(acc, c[tile_m*tile_n] bf16)                           RNE
    """
    _positive("gemm", tile_m=tile_m, tile_k=tile_k, tile_n=tile_n)
    _multiple("gemm", "tile_m", tile_m, GEMM_M_MULTIPLE)
    _multiple("gemm", "tile_k", tile_k, GEMM_K_MULTIPLE)
    _multiple("gemm", "tile_n", tile_n, GEMM_N_MULTIPLE)
    tag = f"m{tile_m}_k{tile_k}_n{tile_n}"
    zero_sym, mac_sym, out_sym = (f"gemm_{part}_bf16_{tag}" for part in ("zero", "mac", "out"))
    defines = (
        ("GEMM_TILE_M", str(tile_m)),
        ("GEMM_TILE_K", str(tile_k)),
        ("GEMM_TILE_N", str(tile_n)),
        ("GEMM_ZERO_SYMBOL", zero_sym),
        ("GEMM_MAC_SYMBOL", mac_sym),
        ("GEMM_OUT_SYMBOL", out_sym),
        # aie_api's block-float mode for the 8x8x8 bf16 mmul on AIE2P (as mlir-air's bf16 GEMM examples
        # build mm_aie2p.cc); the host scalar path ignores it.
        ("AIE_API_EMULATE_BFLOAT16_MMUL_WITH_BFP16", "1"),
    )
    obj = f"gemm_{tag}.o"

    def make(symbol: str) -> ExternalKernel:
        return ExternalKernel(symbol=symbol, obj=obj, source="gemm.cc", defines=defines)

    return GemmKernels(make(zero_sym), make(mac_sym), make(out_sym))


# ---------------------------------------------------------------------------------------------- families
@dataclass(frozen=True)
class ExternalFamily:
    """Everything the layers need to know about one .cc source, in one row: how its object files and
    symbols are named (regexes whose groups are the shape parameters), how to rebuild the ExternalKernel
    from an object name (build driver), and which numpy model the interpreter runs for a symbol
    (kernel_builder.external_models; called with the symbol's regex groups, ints where numeric)."""

    name: str
    source: str
    object_re: str
    symbol_re: str
    from_object: Callable[..., ExternalKernel]
    model: str


def _ints(groups) -> list:
    return [int(g) if g is not None and g.isdigit() else g for g in groups]


FAMILIES: tuple[ExternalFamily, ...] = (
    ExternalFamily("gemv", "gemv.cc", r"mv_k(\d+)_c(\d+)_m(\d+)_r(\d+)\.o", r"mv_bf16_k(\d+)_c(\d+)_m(\d+)_r(\d+)",
                   lambda k, kc, m, r: gemv_kernel(k, kc, m, r), "gemv_model"),
    ExternalFamily("rope", "rope.cc", r"rope_hd(\d+)_h(\d+)_r(\d+)\.o", r"rope_bf16_hd(\d+)_h(\d+)_r(\d+)",
                   lambda hd, h, r: rope_kernel(hd, h, r), "rope_model"),
    ExternalFamily("swiglu", "swiglu.cc", r"swiglu_n(\d+)\.o", r"swiglu_bf16_n(\d+)",
                   lambda n: swiglu_kernel(n), "swiglu_model"),
    ExternalFamily("rmsnorm", "rmsnorm.cc", r"rmsnorm_g(\d+)_u(\d+)\.o", r"rmsnorm_bf16_g(\d+)_u(\d+)",
                   lambda g, u: rmsnorm_kernel(g, u), "rmsnorm_model"),
    ExternalFamily("add", "add.cc", r"add_n(\d+)\.o", r"add_bf16_n(\d+)", lambda n: add_kernel(n), "add_model"),
    ExternalFamily("attention", "attention.cc", r"attn(p|d)_hd(\d+)_q(\d+)_k(\d+)(?:_n(\d+))?\.o",
                   r"attn(p|d)_(init|item|finish|step|merge)_bf16_hd(\d+)_q(\d+)_k(\d+)(?:_n(\d+))?",
                   lambda mode, hd, lq, lk, n: _attention(mode, hd, lq, lk, n or 0).init, "attention_model"),
    ExternalFamily("gemm", "gemm.cc", r"gemm_m(\d+)_k(\d+)_n(\d+)\.o",
                   r"gemm_(zero|mac|out)_bf16_m(\d+)_k(\d+)_n(\d+)",
                   lambda m, k, n: gemm_kernels(m, k, n).zero, "gemm_model"),
)


def kernel_for_object(obj: str) -> ExternalKernel | None:
    """The kernel whose compile produces `obj` (a `link_with` name), or None if no family makes it.

    For an object holding several symbols (attention) this returns its first entry; all share one compile.
    """
    for fam in FAMILIES:
        match = re.fullmatch(fam.object_re, obj)
        if match:
            kernel = fam.from_object(*_ints(match.groups()))
            return kernel if kernel.obj == obj else None  # e.g. "mv_k08_m2.o" is not ours
    return None


def family_of_symbol(symbol: str) -> tuple[ExternalFamily, list] | None:
    """(family, shape parameters) of an external symbol, or None."""
    for fam in FAMILIES:
        match = re.fullmatch(fam.symbol_re, symbol)
        if match:
            return fam, _ints(match.groups())
    return None


def external_model(symbol: str):
    """The numpy model (emu-interp) of an external symbol, or None when no family names it."""
    found = family_of_symbol(symbol)
    if found is None:
        return None
    from . import external_models
    fam, params = found
    return getattr(external_models, fam.model)(*params)


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


def kernel_fingerprint(kernel: ExternalKernel) -> str:
    """sha256 over the source, every shared header, the defines and the Peano flags (build cache key)."""
    h = hashlib.sha256()
    for path in [kernel.source_path, *_headers()]:
        h.update(path.name.encode() + b"\0")
        h.update(path.read_bytes())
        h.update(b"\0")
    for name, value in kernel.defines:
        h.update(f"-D{name}={value}\0".encode())
    for flag in PEANO_FLAGS:
        h.update(flag.encode() + b"\0")
    return h.hexdigest()
