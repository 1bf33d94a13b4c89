"""The block-float output variant of the `rmsnorm` kernel (`out="bfp16"`): its external C++ kernel
(external_kernels/rmsnorm_bfp.cc) - shapes and symbols (two entry points in one object), the numpy model of its
portable path for the interpreter, and the counted cost descriptor; FAMILY and COSTS register them with the
rmsnorm spec beside rmsnorm.cc's."""
from __future__ import annotations

import re
import numpy as np

from external_kernels.compile_rules import ExternalKernel
from kernel_builder import block_float
from kernel_builder.external_costs import SOFT_FLOAT_DIV_STACK, CallWork, ExternalCost
from kernel_builder.external_models import F32, ModelError, need_memref, seq_sum
from kernel_builder.externals import ExternalFamily
from kernel_builder.hw.facts import NPU2
from kernel_builder.instr_counts import Counts, add_acc, conv, load, scalar_bf16, store, vmac
from kernel_builder.numerics import to_bf16
from kernel_builder.planner import check_positive

BLOCK = block_float.BLOCK          # 8 rows per block row, 8 columns per group
SS_LANES = NPU2.vector_lanes_bf16  # f32 lanes of one row's sum of squares (rmsnorm.cc's 32-lane accumulator)
ACC_ELEMS = BLOCK * SS_LANES       # the acc buffer: [8][32] f32


def st_elems(blocks: int) -> int:
    """f32 elements of the kernel's state buffer: the 8 rows' 32-lane sums of squares, then r per row per block."""
    return ACC_ELEMS + BLOCK * blocks


def rmsnorm_bfp_kernel(dim: int, chunk: int, blocks: int, offset: int | None = 0,
                       xwhole: int | None = 0) -> ExternalKernel:
    """One column chunk of `chunk` columns of one of a tile's `blocks` 8-row blocks of `dim`-column rows:
    `(x bf16[8*chunk], w bf16[chunk], st f32[256 + 8*blocks], y i8[9*chunk], f32 eps, int32 phase, int32 blk,
    int32 c0)`; phase 0 sums the squares (carried in st across the chunks of a row; c0 == 0 starts them; the last
    chunk keeps the block's 8 r values in st) and zeroes y, phase 1 normalises and writes the chunk's chunk/8 blocks
    of 72 bytes. `offset` 1: the weight is (1 + w) (tag `_o1`). `xwhole` 1: x is the block's 8 whole rows
    (bf16[8*dim]) and only phase 1 is called: with c0 == 0 it first sums them and keeps r, every call normalises
    columns [c0, c0+chunk) (tag `_x1`)."""
    check_positive("rmsnorm", dim=dim, chunk=chunk, blocks=blocks)
    if chunk % SS_LANES or dim % chunk:
        raise ValueError(f"rmsnorm: chunk={chunk} must be a multiple of {SS_LANES} dividing dim={dim}")
    offset = offset or 0
    if offset not in (0, 1):
        raise ValueError(f"rmsnorm: offset must be 0 or 1, got {offset!r}")
    xwhole = xwhole or 0
    if xwhole not in (0, 1):
        raise ValueError(f"rmsnorm: xwhole must be 0 or 1, got {xwhole!r}")
    tag = f"d{dim}_c{chunk}_b{blocks}" + (f"_o{offset}" if offset else "") + (f"_x{xwhole}" if xwhole else "")
    symbol = f"rmsnorm_bfp_bf16_{tag}"
    return ExternalKernel(symbol=symbol, obj=f"rmsnorm_bfp_{tag}.o", source="rmsnorm_bfp.cc",
                          defines=(("RMSNORM_BFP_DIM", str(dim)), ("RMSNORM_BFP_CHUNK", str(chunk)),
                                   ("RMSNORM_BFP_BLOCKS", str(blocks)), ("RMSNORM_BFP_SYMBOL", symbol),
                                   *((("RMSNORM_BFP_OFFSET", str(offset)),) if offset else ()),
                                   *((("RMSNORM_BFP_XWHOLE", "1"),) if xwhole else ())))


def rmsnorm_bfp_model(dim: int, chunk: int, blocks: int, offset: int | None = None, xwhole: int | None = None):
    """rmsnorm_bfp.cc's portable path: the sequential f32 sum of squares (kept in lane 0 of each row's 32),
    1/sqrt, the bf16 rounding of rmsnorm.cc's scalar path, block_float.encode of the chunk's 8 rows."""
    cols = dim if xwhole else chunk                  # columns of x in L1 (its row stride) and of one phase-0 call
    n, nst = BLOCK * cols, st_elems(blocks)

    def step(x, w, st, y, eps, phase, blk, c0):
        c0, blk = int(c0), int(blk)
        if not (0 <= c0 < dim and c0 % chunk == 0):
            raise ModelError(f"rmsnorm_bfp: column offset {c0} is not a chunk={chunk} chunk of dim={dim}")
        if not 0 <= blk < blocks:
            raise ModelError(f"rmsnorm_bfp: block {blk} is not one of the tile's {blocks}")
        xf = need_memref(x, "x", n).reshape(BLOCK, cols).astype(F32)
        s = need_memref(st, "st", nst, "f32")
        acc, rtab = s[:ACC_ELEMS].reshape(BLOCK, SS_LANES), s[ACC_ELEMS:].reshape(blocks, BLOCK)
        out = need_memref(y, "y", chunk * block_float.GROUP_BYTES, "i8")
        if int(phase) == 0:
            if c0 != 0 and not st.written:
                raise ModelError("rmsnorm_bfp: a later chunk's sum of squares reads st before the first chunk wrote it")
            acc[:, 0] = seq_sum(xf * xf, np.zeros(BLOCK, F32) if c0 == 0 else acc[:, 0].astype(F32))
            if c0 + cols == dim:
                ms = (acc[:, 0].astype(F32) * (F32(1.0) / F32(dim))).astype(F32) + F32(eps)
                rtab[blk] = F32(1.0) / np.sqrt(ms, dtype=F32)
            st.written = True
            if not xwhole:
                out[:] = 0
                y.written = True
            return
        if xwhole and c0 == 0:
            acc[:, 0] = seq_sum(xf * xf, np.zeros(BLOCK, F32))
            ms = (acc[:, 0].astype(F32) * (F32(1.0) / F32(dim))).astype(F32) + F32(eps)
            rtab[blk] = F32(1.0) / np.sqrt(ms, dtype=F32)
            st.written = True
        if not st.written:
            raise ModelError("rmsnorm_bfp: phase 1 reads r before phase 0 wrote it")
        wf = need_memref(w, "w", chunk).astype(F32) + F32(offset or 0)
        r = rtab[blk].astype(F32)
        xc = xf[:, c0:c0 + chunk] if xwhole else xf
        out[:] = block_float.encode(to_bf16((xc * r[:, None]) * wf)).view(np.int8).reshape(-1)
        y.written = True

    return step


def phase0_counts(chunk: int, first, last, zero_y: bool = True) -> Counts:
    """rmsnorm_bfp.cc's phase 0 per call: per row (a later chunk: its 32 sums loaded and widened) chunk/32 x
    (32-lane load, mac), the sums narrowed and stored; the last chunk of a row per row its 32 sums loaded, reduced,
    invsqrt; y (9*chunk bytes) zeroed in 32-byte stores unless x holds whole rows (`zero_y` False: one call sums
    them). `first` / `last`: 1 / 0, or the share of such chunks when unknown."""
    per_row = (load(SS_LANES, 4) + conv()) * (1 - first) + (load(SS_LANES, 2) + vmac(SS_LANES)) * (chunk // SS_LANES) \
        + conv() + store(SS_LANES, 4) + (load(SS_LANES, 4) + Counts(reduce_add=1, invsqrt_scalar=1)) * last
    return per_row * BLOCK + store(32, 1) * (block_float.GROUP_BYTES * chunk // 32) * zero_y


def phase1_counts(chunk: int, offset: int) -> Counts:
    """rmsnorm_bfp.cc's phase 1 per call: per row r as a bf16 pair broadcast over 8 lanes twice; per 8x8 block
    8 + 1 loads of 8 bf16 (x rows, w), 64-lane x * r (mul + mac), the pair (to bf16, widen + sub, to bf16),
    (x * r) * w (mul + mac), to bf16, widen, one bfp16 conversion, one 72-byte store. `offset`: per block (1 + w)
    widened + added and split (4 conversions, 2 adds, one more mac); once the 64-lane 1.0 and its accumulator."""
    per_row = Counts(broadcast=2) + scalar_bf16(2)
    block = (load(8, 2) * (BLOCK + 1) + vmac(64) * 4 + conv(5) + add_acc() + Counts(bfp16_convert=1)
             + Counts(vstore=2, vstore_bytes=block_float.BLOCK_BYTES))
    once = Counts()
    if offset:
        block = block + conv(4) + add_acc(2) + vmac(64)
        once = Counts(broadcast=1) + conv(1) + scalar_bf16(1)
    return per_row * BLOCK + block * (chunk // BLOCK) + once


def _work(m, args):
    """phase (operand 5) and c0 (operand 7) as the analyzer evaluates them; unknown: the mean over a block's calls
    (half of them phase 0, chunk/dim of those the first and the last chunk)."""
    dim, chunk, offset, xwhole = int(m.group(1)), int(m.group(2)), int(m.group(4) or 0), bool(m.group(5))
    phase = args[5] if len(args) > 5 and isinstance(args[5], int) else None
    c0 = args[7] if len(args) > 7 and isinstance(args[7], int) else None
    first = (c0 == 0) if c0 is not None else chunk / dim
    last = (c0 + chunk == dim) if c0 is not None else chunk / dim
    # scalar f32 ops: phase 0's last chunk per row the mean's multiply and the eps add; phase 1 per row r - r_hi
    p0 = CallWork(BLOCK * chunk, 2 * BLOCK * last, phase0_counts(chunk, first, last))
    p1 = CallWork((5 + offset) * BLOCK * chunk, BLOCK, phase1_counts(chunk, offset))
    if xwhole:       # phase 1 only; its first chunk sums the whole rows first (no y zeroing)
        sums = CallWork(BLOCK * dim, 2 * BLOCK, phase0_counts(dim, 1, 1, zero_y=False))
        p1 = CallWork(p1.vector_macs + sums.vector_macs * first, p1.scalar_ops + sums.scalar_ops * first,
                      p1.counts + sums.counts * first)
        return p1
    if phase is not None:
        return p1 if phase else p0
    return CallWork((p0.vector_macs + p1.vector_macs) / 2, (p0.scalar_ops + p1.scalar_ops) / 2,
                    (p0.counts + p1.counts) * 0.5)


SYMBOL_RE = r"rmsnorm_bfp_bf16_d(\d+)_c(\d+)_b(\d+)(?:_o(\d+))?(?:_x(\d+))?"
FAMILY = ExternalFamily("rmsnorm_bfp", "rmsnorm_bfp.cc",
                        r"rmsnorm_bfp_d(\d+)_c(\d+)_b(\d+)(?:_o(\d+))?(?:_x(\d+))?\.o", SYMBOL_RE,
                        rmsnorm_bfp_kernel, rmsnorm_bfp_model)
# step(x, w, st, y, eps, phase, blk, c0) writes st (phase 0: read back by later chunks and phase 1) and y (both
# phases: zeros, then the chunk's blocks)
COSTS = (ExternalCost("rmsnorm_bfp", re.compile(SYMBOL_RE), _work, SOFT_FLOAT_DIV_STACK, (2, 3), (3,), (5, 7)),)
