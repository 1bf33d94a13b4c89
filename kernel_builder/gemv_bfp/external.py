"""The `gemv_bfp` kernel's external C++ kernel (external_kernels/gemv_bfp.cc): its shapes and symbols
(ExternalKernel), its numpy model for the interpreter (the .cc's portable path: kernel_builder.gemv_bfp.reference's
arithmetic on one step's bytes) and its counted cost descriptor; FAMILY and COSTS register them with the spec."""
from __future__ import annotations

import re

import numpy as np

from external_kernels.compile_rules import ExternalKernel
from kernel_builder import block_float
from kernel_builder.external_costs import DEFAULT_STACK, CallWork, ExternalCost
from kernel_builder.external_models import F32, ModelError, need_memref
from kernel_builder.externals import ExternalFamily
from kernel_builder.gemv_bfp.reference import accumulate_blocks
from kernel_builder.instr_counts import Counts, add_acc, conv, load, store
from kernel_builder.numerics import to_bf16
from kernel_builder.planner import check_positive

BFP_BLOCK = block_float.BLOCK          # 8: K chunks and row steps are whole 8x8 blocks
BFP_MAX_ROW_BLOCKS = 2                 # block rows per call (gemv_bfp.cc keeps one 64-lane accumulator each)


def gemv_bfp_kernel(k: int, kc: int, tile_m: int, rows: int, bias: bool = False) -> ExternalKernel:
    """One block-float GEMV step of a herd tile: block rows [row/8, (row+tile_m)/8) of its `rows` outputs, K chunk
    [k0, k0+kc): `(w i8[tile_m*kc*9/8], x bf16[k (+ rows)], acc f32[tile_m], y bf16[rows], int32 row, int32 k0)`;
    w holds tile_m/8 block rows' K chunks in the at-rest layout (kernel_builder.block_float), f32 partial sums
    carried in `acc` across chunks, the last chunk writes bf16 RNE into y. `bias` (gemv_bfp_bias): the tile's bias
    rows after x, added to the f32 sums before the rounding (symbol `mvbfpb_bf16_...`, -DGBFP_BIAS=1)."""
    check_positive("gemv_bfp", k=k, kc=kc, tile_m=tile_m, rows=rows)
    for name, v in (("k", k), ("kc", kc), ("tile_m", tile_m), ("rows", rows)):
        if v % BFP_BLOCK:
            raise ValueError(f"gemv_bfp: {name}={v} must be a multiple of {BFP_BLOCK} (whole 8x8 block-float blocks)")
    if k % kc:
        raise ValueError(f"gemv_bfp: kc={kc} must divide k={k}")
    if rows % tile_m:
        raise ValueError(f"gemv_bfp: tile_m={tile_m} must divide rows={rows}")
    if tile_m > BFP_BLOCK * BFP_MAX_ROW_BLOCKS:
        raise ValueError(f"gemv_bfp: tile_m={tile_m}: at most {BFP_BLOCK * BFP_MAX_ROW_BLOCKS} rows per step "
                         f"(one accumulator per 8-row block row in registers)")
    tag, base = f"k{k}_c{kc}_m{tile_m}_r{rows}", "mvbfpb" if bias else "mvbfp"
    symbol = f"{base}_bf16_{tag}"
    return ExternalKernel(
        symbol=symbol, obj=f"{base}_{tag}.o", source="gemv_bfp.cc",
        defines=(("GBFP_K", str(k)), ("GBFP_KC", str(kc)), ("GBFP_TILE_M", str(tile_m)), ("GBFP_ROWS", str(rows)),
                 ("GBFP_SYMBOL", symbol), *((("GBFP_BIAS", "1"),) if bias else ())))


def gemv_bfp_model(k: int, kc: int, tm: int, rows: int, bias: bool = False):
    def mv(w, x, acc, y, row, k0):
        wb = need_memref(w, "w", tm * kc * block_float.GROUP_BYTES // BFP_BLOCK, "i8")
        xs = need_memref(x, "x", k + rows * bias)
        a = need_memref(acc, "acc", tm, "f32")
        out = need_memref(y, "y", rows)
        r, c0 = int(row), int(k0)
        if not (0 <= r and r + tm <= rows and r % tm == 0):
            raise ModelError(f"row offset {r} is not a tile_m={tm} block of the {rows} output rows")
        if not (0 <= c0 < k and c0 % kc == 0):
            raise ModelError(f"k offset {c0} is not a kc={kc} chunk of k={k}")
        if c0 > 0 and not acc.written:
            raise ModelError("a later K chunk reads the f32 partial sums before any chunk wrote them")
        init = np.zeros(tm, dtype=F32) if c0 == 0 else a.astype(F32)
        wf = block_float.decode(wb.view(np.uint8), tm, kc)
        s = accumulate_blocks(wf, xs[c0:c0 + kc].astype(F32), init)
        if c0 + kc >= k:
            if bias:
                s = (s + xs[k + r:k + r + tm].astype(F32)).astype(F32)
            out[r:r + tm] = to_bf16(s)
            y.written = True
        else:
            a[:] = s
            acc.written = True
    return mv


def _gemv_bfp(m, args, bias: bool = False):
    """Counted formula of gemv_bfp.cc's vector path (equal to the host aie_api's counts, tests/test_gemv_bfp.py):
    per K block x's 8 values loaded (16 bytes), widened and converted to block float once, and per block row one
    72-byte block popped (two 512-bit loads) and one mac_8x8_8x8T; per block row a later chunk first loads its 8
    carried f32 sums; the last chunk (with the bias: its 8 values loaded, widened, added) converts and stores 8
    bf16 outputs, an earlier one converts and stores 8 f32 partial sums."""
    k, kc, tm = int(m.group(1)), int(m.group(2)), int(m.group(3))
    nb, kb = tm // BFP_BLOCK, kc // BFP_BLOCK
    k0 = args[5] if len(args) > 5 and isinstance(args[5], int) else None
    first = (k0 == 0) if k0 is not None else kc / k     # unknown chunk: the share of first / last chunks
    last = (k0 + kc >= k) if k0 is not None else kc / k
    pop = Counts(vload=2, vload_bytes=block_float.BLOCK_BYTES, mmul_bfp16_8x8x8=1)
    per_kb = load(8, 2) + conv() + Counts(bfp16_convert=1) + pop * nb
    epilogue = (load(8, 2) + conv() + add_acc()) * bias + conv() + store(8, 2)
    carry_in, carry_out = load(8, 4), conv() + store(8, 4)     # a later chunk's 8 sums in / an earlier one's out
    counts = carry_in * nb * (1 - first) + per_kb * kb + (epilogue * last + carry_out * (1 - last)) * nb
    return CallWork(kc * tm, 0, counts)


FAMILY = ExternalFamily("gemv_bfp", "gemv_bfp.cc", r"mvbfp_k(\d+)_c(\d+)_m(\d+)_r(\d+)\.o",
                        r"mvbfp_bf16_k(\d+)_c(\d+)_m(\d+)_r(\d+)", gemv_bfp_kernel, gemv_bfp_model)
COSTS = (
    # gemv_bfp(w, x, acc, y, row, k0): writes acc (partial sums, read back by later K chunks) and y
    ExternalCost("gemv_bfp", re.compile(FAMILY.symbol_re), _gemv_bfp, DEFAULT_STACK, (2, 3), (3,)),
)
