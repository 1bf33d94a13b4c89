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
from kernel_builder.instr_counts import Counts, add_acc, conv, load, scalar_bf16, store, vmac
from kernel_builder.numerics import to_bf16
from kernel_builder.planner import check_positive

BLOCK = block_float.BLOCK          # 8 rows per block row, 8 columns per group
SS_LANES = 32                      # f32 lanes of one row's sum of squares (rmsnorm.cc's accumulator)
ACC_ELEMS = BLOCK * SS_LANES       # the acc buffer: [8][32] f32


def rmsnorm_bfp_kernel(dim: int, chunk: int, offset: int | None = 0) -> ExternalKernel:
    """One column chunk of `chunk` columns of an 8-row block of `dim`-column rows: `(x bf16[8*chunk], w bf16[chunk],
    acc f32[256], y i8[9*dim], f32 eps, int32 phase, int32 c0)`; phase 0 sums the squares (carried in acc across
    the chunks of a row, c0 == 0 starts them), phase 1 normalises and writes the chunk's chunk/8 blocks of 72 bytes
    at y + 9*c0 (y: the block row). `offset` 1: the weight is (1 + w) (tag `_o1`)."""
    check_positive("rmsnorm", dim=dim, chunk=chunk)
    if chunk % SS_LANES or dim % chunk:
        raise ValueError(f"rmsnorm: chunk={chunk} must be a multiple of {SS_LANES} dividing dim={dim}")
    offset = offset or 0
    if offset not in (0, 1):
        raise ValueError(f"rmsnorm: offset must be 0 or 1, got {offset!r}")
    tag = f"d{dim}_c{chunk}" + (f"_o{offset}" if offset else "")
    symbol = f"rmsnorm_bfp_bf16_{tag}"
    return ExternalKernel(symbol=symbol, obj=f"rmsnorm_bfp_{tag}.o", source="rmsnorm_bfp.cc",
                          defines=(("RMSNORM_BFP_DIM", str(dim)), ("RMSNORM_BFP_CHUNK", str(chunk)),
                                   ("RMSNORM_BFP_SYMBOL", symbol),
                                   *((("RMSNORM_BFP_OFFSET", str(offset)),) if offset else ())))


def rmsnorm_bfp_model(dim: int, chunk: int, offset: int | None = None):
    """rmsnorm_bfp.cc's portable path: the sequential f32 sum of squares (kept in lane 0 of each row's 32),
    1/sqrt, the bf16 rounding of rmsnorm.cc's scalar path, block_float.encode of the chunk's 8 rows."""
    n = BLOCK * chunk

    def ss(xf, acc, c0):
        a = need_memref(acc, "acc", ACC_ELEMS, "f32").reshape(BLOCK, SS_LANES)
        if c0 != 0 and not acc.written:
            raise ModelError("rmsnorm_bfp: a later chunk's sum of squares reads acc before the first chunk wrote it")
        a[:, 0] = seq_sum(xf * xf, np.zeros(BLOCK, F32) if c0 == 0 else a[:, 0].astype(F32))
        acc.written = True

    def norm(xf, w, acc, y, eps, c0):
        wf = need_memref(w, "w", chunk).astype(F32) + F32(offset or 0)
        if not acc.written:
            raise ModelError("rmsnorm_bfp: phase 1 reads the sums of squares before phase 0 wrote them")
        ss_ = need_memref(acc, "acc", ACC_ELEMS, "f32").reshape(BLOCK, SS_LANES)[:, 0].astype(F32)
        r = F32(1.0) / np.sqrt((ss_ * (F32(1.0) / F32(dim))).astype(F32) + F32(eps), dtype=F32)
        out = need_memref(y, "y", dim * block_float.GROUP_BYTES, "i8")
        out[9 * c0:9 * (c0 + chunk)] = block_float.encode(to_bf16((xf * r[:, None]) * wf)).view(np.int8).reshape(-1)
        y.written = True

    def step(x, w, acc, y, eps, phase, c0):
        c0 = int(c0)
        if not (0 <= c0 < dim and c0 % chunk == 0):
            raise ModelError(f"rmsnorm_bfp: column offset {c0} is not a chunk={chunk} chunk of dim={dim}")
        xf = need_memref(x, "x", n).reshape(BLOCK, chunk).astype(F32)
        if int(phase) == 0:
            ss(xf, acc, c0)
        else:
            norm(xf, w, acc, y, eps, c0)

    return step


def ss_counts(chunk: int, first) -> Counts:
    """rmsnorm_bfp.cc's ss per call: per row (a later chunk: its 32 sums loaded and widened) chunk/32 x (32-lane
    load, mac), the sums narrowed and stored. `first`: 1 / 0, or the share of first chunks when unknown."""
    per_row = (load(SS_LANES, 4) + conv()) * (1 - first) + (load(SS_LANES, 2) + vmac(SS_LANES)) * (chunk // SS_LANES) \
        + conv() + store(SS_LANES, 4)
    return per_row * BLOCK


def norm_counts(chunk: int, offset: int) -> Counts:
    """rmsnorm_bfp.cc's norm per call: per row the 32 sums loaded and reduced, invsqrt, r as a bf16 pair broadcast
    over 8 lanes twice; per 8x8 block 8 + 1 loads of 8 bf16 (x rows, w), 64-lane x * r (mul + mac), the pair
    (to bf16, widen + sub, to bf16), (x * r) * w (mul + mac), to bf16, widen, one bfp16 conversion, one 72-byte
    store. `offset`: per block (1 + w) widened + added and split (4 conversions, 2 adds, one more mac); once the
    64-lane 1.0 and its accumulator."""
    per_row = load(SS_LANES, 4) + Counts(reduce_add=1, invsqrt_scalar=1, broadcast=2) + scalar_bf16(2)
    block = (load(8, 2) * (BLOCK + 1) + vmac(64) * 4 + conv(5) + add_acc() + Counts(bfp16_convert=1)
             + Counts(vstore=2, vstore_bytes=block_float.BLOCK_BYTES))
    once = Counts()
    if offset:
        block = block + conv(4) + add_acc(2) + vmac(64)
        once = Counts(broadcast=1) + conv(1) + scalar_bf16(1)
    return per_row * BLOCK + block * (chunk // BLOCK) + once


def _work(m, args):
    """phase (operand 5) and c0 (operand 6) as the analyzer evaluates them; unknown: the mean over a block's calls
    (half of them phase 0, chunk/dim of those the first chunk)."""
    dim, chunk, offset = int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)
    phase = args[5] if len(args) > 5 and isinstance(args[5], int) else None
    c0 = args[6] if len(args) > 6 and isinstance(args[6], int) else None
    first = (c0 == 0) if c0 is not None else chunk / dim
    ss_w = CallWork(BLOCK * chunk, 0, ss_counts(chunk, first))
    norm_w = CallWork((5 + offset) * BLOCK * chunk, 4 * BLOCK, norm_counts(chunk, offset))
    if phase is not None:
        return norm_w if phase else ss_w
    return CallWork((ss_w.vector_macs + norm_w.vector_macs) // 2, norm_w.scalar_ops // 2,
                    (ss_w.counts + norm_w.counts) * 0.5)


SYMBOL_RE = r"rmsnorm_bfp_bf16_d(\d+)_c(\d+)(?:_o(\d+))?"
FAMILY = ExternalFamily("rmsnorm_bfp", "rmsnorm_bfp.cc", r"rmsnorm_bfp_d(\d+)_c(\d+)(?:_o(\d+))?\.o", SYMBOL_RE,
                        rmsnorm_bfp_kernel, rmsnorm_bfp_model)
# step(x, w, acc, y, eps, phase, c0) writes acc (phase 0: read back by later chunks and phase 1) and y (phase 1,
# one chunk's bytes of the block row)
COSTS = (ExternalCost("rmsnorm_bfp", re.compile(SYMBOL_RE), _work, SOFT_FLOAT_DIV_STACK, (2, 3), (), (5, 6)),)
