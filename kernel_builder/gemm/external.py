"""The `gemm` kernel's external C++ kernel (external_kernels/gemm.cc): its shapes and symbols
(ExternalKernel), its numpy model for the interpreter (the .cc's portable path) and its cost/resource
descriptor for the hardware model; FAMILY and COSTS register them with the kernel spec."""
from __future__ import annotations

import functools
import re
from typing import NamedTuple

import numpy as np

from external_kernels.compile_rules import ExternalKernel
from kernel_builder.external_costs import DEFAULT_STACK, CallWork, ExternalCost, bfp16_mmul
from kernel_builder.instr_counts import Counts, add_acc, conv, exp2, inv, load, scalar_bf16, store, vmac
from kernel_builder.external_models import F32, need_memref
from kernel_builder.externals import ExternalFamily, check_multiple
from kernel_builder.hw.facts import NPU2
from kernel_builder.numerics import to_bf16
from kernel_builder.planner import check_positive

GEMM_M_MULTIPLE, GEMM_K_MULTIPLE, _GEMM_N_BLOCK = NPU2.bfp16_mmul_shape   # 8x8 blocks
GEMM_N_MULTIPLE = 2 * _GEMM_N_BLOCK   # two 8-column blocks per mmul step


class GemmKernels(NamedTuple):
    """The GEMM micro-kernel's entry points; they share one object file (one compile per tile)."""

    zero: ExternalKernel
    mac: ExternalKernel
    out: ExternalKernel
    glu: ExternalKernel
    bias: ExternalKernel

    def epilogue(self, name: str) -> ExternalKernel:
        """The epilogue entry point `name` (EPILOGUES)."""
        return {"none": self.out, "swiglu": self.glu, "bias": self.bias}[name]

    @property
    def obj(self) -> str:
        return self.zero.obj


W_FORMATS = ("bf16", "bfp16")   # the W tile's format in L1: bf16 8x8 blocks, or block float at rest (gemm_bfp.cc)
A_FORMATS = ("bf16", "bfp16")   # the A tile's: bf16 8x8 blocks (converted in the core), or block float at rest
BFP_COL_BYTES = 9                # bytes per weight column of an 8-row block row in block float (72 per 8x8 block)


def bfp_chunk_k(tile_k: int) -> int:
    """K columns per chunk of a block-float W tile in L1 (gemm_bfp.cc: [tile_k/C][tile_n/8][C/8] blocks): the
    largest multiple of 8 dividing tile_k whose block-row run, 9 C bytes, fits one memory-tile BD dim of i8
    elements (NPU2.bd_max_size; the real lowering refused a 576-byte run: the tools merge contiguous dims)."""
    return max(c for c in range(8, tile_k + 1, 8) if tile_k % c == 0 and BFP_COL_BYTES * c <= NPU2.bd_max_size)


def gemm_kernels(tile_m: int, tile_k: int, tile_n: int, w: str = "bf16", a: str = "bf16",
                 c: str = "bf16") -> GemmKernels:
    """One compute tile's GEMM step on 8x8-blocked L1 buffers (layouts in external_kernels/gemm.cc). The
    accumulator is 2*tile_m*tile_n bf16 (the bytes of tile_m*tile_n f32); every epilogue writes its bf16 tile in
    place over the front of it:

    zero(acc)
    mac(a[tile_m*tile_k] bf16, w[tile_n*tile_k] bf16, acc, scratch[scratch_elems(tile_m, tile_k)] bf16)
                                                              acc += a . w^T (w rows = output columns)
    out(acc)                                                  c[tile_m*tile_n] = bf16(acc), RNE
    glu(acc)                                                  c[tile_m*tile_n/2] = silu(gate) * up (column-block pairs)
    bias(acc, b[tile_n] bf16)                                 c[tile_m*tile_n] = bf16(acc + b[col])

    w="bfp16": the object of external_kernels/gemm_bfp.cc (gemm.cc included, its bf16 mac renamed), whose mac takes
    the W tile in block float (blocks of 72 bytes, kernel_builder/block_float.py's layout, in K chunks of
    bfp_chunk_k(tile_k) columns: [tile_k/C][tile_n/8][C/8]): mac(a, w[tile_n*tile_k*9/8] i8, acc, scratch); the
    other entry points are gemm.cc's. a="bfp16" (with w="bfp16"): the same object, its mac the entry point whose
    A tile arrives in block float too, in the W tile's chunked order [tile_k/C][tile_m/8][C/8] (no scratch):
    mac(a[tile_m*tile_k*9/8] i8, w i8, acc). c="bfp16" (with w="bfp16"): the same source compiled as the object
    `gemm_bfpc_<tag>.o`, every symbol prefixed `gemm_bfpc_`: a module writing C in block float types its
    accumulator i8 (kernel_builder/gemm/c_bfp.py), so its declarations of zero / mac differ from a bf16-C module's,
    and one stitched module may hold both (the gate/up GEMM writes block float, the down GEMM bf16).
    """
    if c not in C_FORMATS:
        raise ValueError(f"gemm: unknown C format {c!r} (known: {', '.join(C_FORMATS)})")
    if c == "bfp16" and w != "bfp16":
        raise ValueError("gemm: C in block float needs W in block float (gemm_bfp.cc)")
    if a not in A_FORMATS:
        raise ValueError(f"gemm: unknown A format {a!r} (known: {', '.join(A_FORMATS)})")
    if a == "bfp16" and w != "bfp16":
        raise ValueError("gemm: A in block float needs W in block float (gemm_bfp.cc)")
    if w not in W_FORMATS:
        raise ValueError(f"gemm: unknown W format {w!r} (known: {', '.join(W_FORMATS)})")
    check_positive("gemm", tile_m=tile_m, tile_k=tile_k, tile_n=tile_n)
    check_multiple("gemm", "tile_m", tile_m, GEMM_M_MULTIPLE)
    check_multiple("gemm", "tile_k", tile_k, GEMM_K_MULTIPLE)
    check_multiple("gemm", "tile_n", tile_n, GEMM_N_MULTIPLE)
    tag = f"m{tile_m}_k{tile_k}_n{tile_n}"
    parts = ("zero", "mac", "out", "glu", "bias")
    syms = {part: f"gemm_{part}_bf16_{tag}" for part in parts}
    defines = (
        ("GEMM_TILE_M", str(tile_m)),
        ("GEMM_TILE_K", str(tile_k)),
        ("GEMM_TILE_N", str(tile_n)),
        *((f"GEMM_{part.upper()}_SYMBOL", syms[part]) for part in parts),
        # aie_api's block-float mode for the 8x8x8 bf16 mmul on AIE2P (as mlir-air's bf16 GEMM examples
        # build mm_aie2p.cc); the host scalar path ignores it.
        ("AIE_API_EMULATE_BFLOAT16_MMUL_WITH_BFP16", "1"),
    )
    obj, source = f"gemm_{tag}.o", "gemm.cc"
    if w == "bfp16":
        pre = "gemm_bfpc" if c == "bfp16" else "gemm_bfp"
        syms = {part: f"{pre}_{part}_bf16_{tag}" for part in parts}
        renamed = {f"GEMM_{part.upper()}_SYMBOL": syms[part] for part in parts}
        renamed["GEMM_MAC_SYMBOL"] = f"{pre}_bf16mac_bf16_{tag}"     # gemm.cc's own mac, unused here
        defines = tuple((name, renamed.get(name, v)) for name, v in defines) + (
            ("GEMM_BFP_MAC_SYMBOL", syms["mac"]), ("GEMM_W_CHUNK_K", str(bfp_chunk_k(tile_k))),
            ("GEMM_BFP_MACA_SYMBOL", f"{pre}_maca_bf16_{tag}"),
            *((f"GEMM_{part.upper()}C_SYMBOL", f"{pre}_{part}c_bf16_{tag}") for part in C_BFP_PARTS))
        obj, source = f"{pre}_{tag}.o", "gemm_bfp.cc"
        if a == "bfp16":   # the A-at-rest mac of the same object
            syms["mac"] = f"{pre}_maca_bf16_{tag}"

    def make(symbol: str) -> ExternalKernel:
        return ExternalKernel(symbol=symbol, obj=obj, source=source, defines=defines)

    return GemmKernels(*(make(syms[part]) for part in parts))


C_FORMATS = ("bf16", "bfp16")   # the output C's format: bf16, or block float at rest (gemm_c_bfp.h's epilogues)
C_BFP_PARTS = ("out", "glu")    # the epilogues with a block-float twin (outc / gluc in the gemm_bfp.cc object)


def c_epilogue(ks: GemmKernels, name: str, c: str = "bf16") -> ExternalKernel:
    """The epilogue entry point `name` writing C in format `c` (C_FORMATS): "bfp16" = external_kernels/
    gemm_c_bfp.h's twin of out / glu in the gemm_bfp.cc object (the tile as 72-byte blocks [tile_m/8][out_n/8],
    block_float.encode of the bf16 values, in place over the accumulator's front)."""
    if c not in C_FORMATS:
        raise ValueError(f"gemm: unknown C format {c!r} (known: {', '.join(C_FORMATS)})")
    epi = ks.epilogue(name)
    if c == "bf16":
        return epi
    part = {"none": "out", "swiglu": "glu"}.get(name)
    symbol = dict(epi.defines).get(f"GEMM_{(part or '').upper()}C_SYMBOL")
    if symbol is None:
        raise ValueError(f"gemm: C in block float needs W in block float (gemm_bfp.cc) and the epilogue 'none' or "
                         f"'swiglu', not {name!r}")
    return ExternalKernel(symbol=symbol, obj=epi.obj, source=epi.source, defines=epi.defines)


def scratch_elems(tile_m: int, tile_k: int) -> int:
    """bf16 elements of the mac's block-float scratch: tile_m*tile_k/64 blocks of 72 bytes (64 8-bit mantissas
    + 8 exponents), i.e. 9/16 of the a tile's elements."""
    return tile_m * tile_k * 9 // 16


def _unblock(x: np.ndarray, rows: int, cols: int) -> np.ndarray:
    """[rows/8][cols/8][8][8] blocks (each row-major) -> the [rows, cols] matrix."""
    return x.reshape(rows // 8, cols // 8, 8, 8).transpose(0, 2, 1, 3).reshape(rows, cols)


def _block(x: np.ndarray) -> np.ndarray:
    """The inverse of _unblock: a [rows, cols] matrix -> its flat 8x8-blocked layout."""
    rows, cols = x.shape
    return x.reshape(rows // 8, 8, cols // 8, 8).transpose(0, 2, 1, 3).reshape(-1)


def _acc(acc, tm: int, tn: int) -> np.ndarray:
    """The accumulator memref (2*tm*tn bf16; 4*tm*tn i8 in a module writing C in block float, gemm/c_bfp.py) as its
    tm*tn f32 values (a view: writes go to the same bytes)."""
    if getattr(acc, "dtype", None) == "i8":
        return need_memref(acc, "acc", 4 * tm * tn, "i8").view(F32)
    return need_memref(acc, "acc", 2 * tm * tn).view(F32)


def mac_values(af: np.ndarray, wf: np.ndarray, acc, tm: int, tn: int) -> None:
    """acc += af . wf^T as the scalar path adds it (af [tm, tk], wf [tn, tk] f32 holding bf16 values)."""
    view = _acc(acc, tm, tn)
    cf = _unblock(view, tm, tn)
    # bf16 x bf16 products are exact in f32; the host loop adds them to acc one k at a time, in
    # ascending k: a float32 cumsum starting from acc is that order, bit for bit.
    terms = np.concatenate([cf[:, :, None], af[:, None, :] * wf[None, :, :]], axis=2)
    view[:] = _block(np.cumsum(terms, axis=2, dtype=F32)[:, :, -1])
    acc.written = True


def gemm_model(part: str, tm: int, tk: int, tn: int):
    """external_kernels/gemm.cc on its 8x8-blocked L1 tiles: zero / mac (acc += a . w^T) / the in-place
    epilogues out (bf16 RNE), glu (silu(gate) * up of the column-block pairs), bias (acc + b[col])."""

    def zero(acc):
        _acc(acc, tm, tn)[:] = 0.0
        acc.written = True

    def mac(a, w, acc, scratch):
        need_memref(scratch, "scratch", scratch_elems(tm, tk))   # the vector path's; the scalar path ignores it
        af = _unblock(need_memref(a, "a", tm * tk), tm, tk).astype(F32)
        wf = _unblock(need_memref(w, "w", tn * tk), tn, tk).astype(F32)
        mac_values(af, wf, acc, tm, tn)

    def out(acc):
        c = to_bf16(_acc(acc, tm, tn))
        acc.data[:tm * tn] = c
        acc.written = True

    def glu(acc):
        blocks = _acc(acc, tm, tn).reshape(tm // 8, tn // 8, 64)   # column blocks in (gate, up) pairs
        g = to_bf16(blocks[:, 0::2]).astype(F32)
        u = to_bf16(blocks[:, 1::2]).astype(F32)
        with np.errstate(over="ignore"):
            y = to_bf16(g / (F32(1.0) + np.exp(-g)) * u)
        acc.data[:tm * tn // 2] = y.reshape(-1)
        acc.written = True

    def bias(acc, b):
        bv = need_memref(b, "b", tn).astype(F32)
        cf = _unblock(_acc(acc, tm, tn), tm, tn) + bv[None, :]
        acc.data[:tm * tn] = _block(to_bf16(cf))
        acc.written = True

    return {"zero": zero, "mac": mac, "out": out, "glu": glu, "bias": bias}[part]


def gemm_work(m, args) -> CallWork:
    """The cost descriptor's work of one call of any gemm.cc entry point (symbol groups: part, m, k, n); the
    gemm_swiglu and gemm_bias packages register their epilogue's rows with it."""
    return _gemm(m, args)


def epilogue_family(kind: str, part: str) -> ExternalFamily:
    """The ExternalFamily of one gemm.cc epilogue entry point registered by another kind (same object)."""
    return ExternalFamily(kind, "gemm.cc", r"gemm_m(\d+)_k(\d+)_n(\d+)\.o",
                          rf"gemm_({part})_bf16_m(\d+)_k(\d+)_n(\d+)",
                          lambda m, k, n: getattr(gemm_kernels(m, k, n), part), gemm_model)


def epilogue_costs(kind: str, part: str) -> tuple:
    return (ExternalCost(kind, re.compile(rf"gemm_({part})_bf16_m(\d+)_k(\d+)_n(\d+)"), _gemm, DEFAULT_STACK, (0,)),)


def _gemm(m, args):
    part, tm, tk, tn = m.group(1), int(m.group(2)), int(m.group(3)), int(m.group(4))
    steps = tm * tn // 32
    if part == "zero":   # 32-lane f32 zero stores
        return CallWork(0, 0, store(32, 4) * steps)
    if part == "out":    # load f32, widen, round to bf16, store
        return CallWork(0, 0, (load(32, 4) + conv(2) + store(32, 2)) * steps)
    if part == "glu":    # per 32 outputs: gate and up lanes to bf16, then swiglu.cc's step
        step = ((load(32, 4) + conv(2)) * 2 + vmac(32) * 4 + exp2(32) + inv(32) + add_acc() + conv(5)
                + store(32, 2))
        return CallWork(4 * tm * tn // 2, 0, step * (steps // 2) + scalar_bf16(3) + Counts(broadcast=1) + conv(1))
    if part == "bias":   # per 8x8 block one 8-lane bias load; per 32 lanes load, widen, add, round, store
        return CallWork(0, 0, load(8, 2) * (tm * tn // 64) + (load(32, 4) + conv(3) + add_acc() + store(32, 2)) * steps)
    return CallWork(tm * tk * tn, 0, gemm_mac_counts(tm, tk, tn, bfp16_mmul(_gemm_defines(tm, tk, tn))))


def gemm_mac_counts(tm: int, tk: int, tn: int, block_float: bool = True, a_scratch: bool = True,
                    w_at_rest: bool = False, a_at_rest: bool = False) -> Counts:
    """One mac call (gemm.cc): every A block loaded, widened, converted to bfp16ebs8 and stored (72 bytes) once
    into the scratch, every W block likewise once, in place over the W tile; then per (row-block pair or single,
    column-block pair) the 2 x um f32 C blocks are loaded (one widen each); per K block um block-float A blocks
    and two block-float W blocks are reloaded (no transpose: a W block is mac_8x8_8x8T's [n][k] operand as
    stored), and 2 x um block-float 8x8x8 mmuls run; the C blocks are stored. gemm.cc compiles only with the
    block-float flag. `a_scratch=False`: the loops of gemm.cc before its block-float conversions were hoisted,
    converting the A and the W blocks per register block (mlir-air's mm_aie2p.cc 2x2 kernel, which
    benchmarks/hw_calibration.py models the reference design's GEMMs with, converts at least that much).
    `w_at_rest`: gemm_bfp.cc's mac, whose W tile arrives in block float (no W conversion; its 72-byte blocks
    popped straight from the tile by the same loop); `a_at_rest`: its maca, whose A tile arrives in block float too
    (no conversion at all: only the register-blocked loop)."""
    if not block_float:
        raise ValueError("gemm.cc's vector path is block-float only (it requires "
                         "AIE_API_EMULATE_BFLOAT16_MMUL_WITH_BFP16=1)")
    mb, nb, kb = tm // 8, tn // 8, tk // 8
    um = 2 if mb % 2 == 0 else 1
    iters = (mb // um) * (nb // 2)
    blk = 64
    convert = load(blk, 2) + Counts(vconvert=1, bfp16_convert=1)
    bfp = 72   # bytes of one stored v64bfp16ebs8 (a 576-bit access: two 512-bit instructions)
    if not a_scratch:
        per_k = convert * (um + 2) + Counts(mmul_bfp16_8x8x8=1) * (2 * um)
        return ((load(blk, 4) + conv() + store(blk, 4)) * (2 * um) + per_k * kb) * iters
    once = (convert + Counts(vstore=2, vstore_bytes=bfp)) * ((0 if a_at_rest else mb * kb)
                                                             + (0 if w_at_rest else nb * kb))   # A, W
    per_k = Counts(vload=2, vload_bytes=bfp) * (um + 2) + Counts(mmul_bfp16_8x8x8=1) * (2 * um)
    per_iter = (load(blk, 4) + conv() + store(blk, 4)) * (2 * um) + per_k * kb
    return once + per_iter * iters


@functools.lru_cache(maxsize=None)
def _gemm_defines(tm: int, tk: int, tn: int) -> tuple:
    return gemm_kernels(tm, tk, tn).mac.defines


FAMILY = ExternalFamily("gemm", "gemm.cc", r"gemm_m(\d+)_k(\d+)_n(\d+)\.o",
                        r"gemm_(zero|mac|out)_bf16_m(\d+)_k(\d+)_n(\d+)",
                        lambda m, k, n: gemm_kernels(m, k, n).zero, gemm_model)
COSTS = (
    ExternalCost("gemm_zero", re.compile(r"gemm_(zero)_bf16_m(\d+)_k(\d+)_n(\d+)"), _gemm, DEFAULT_STACK, (0,), (0,)),
    # the mac writes the accumulator, the A scratch and (its vector path's in-place block-float copy) the W tile
    ExternalCost("gemm_mac", re.compile(r"gemm_(mac)_bf16_m(\d+)_k(\d+)_n(\d+)"), _gemm, DEFAULT_STACK, (1, 2, 3)),
    ExternalCost("gemm_out", re.compile(r"gemm_(out)_bf16_m(\d+)_k(\d+)_n(\d+)"), _gemm, DEFAULT_STACK, (0,)),
)
