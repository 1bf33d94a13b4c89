"""The `gemm_bfp` kernel's external C++ kernel (external_kernels/gemm_bfp.cc, which includes gemm.cc): its symbols
(kernel_builder.gemm.external.gemm_kernels with the "bfp16" W format), the numpy model of its portable path for the
interpreter (the mac on block_float.decode of the W tile; the maca, whose A tile is at rest in block float too, on
both decoded tiles; zero / out / glu / bias are gemm.cc's) and its cost descriptor (gemm.cc's counts without the W
conversion: gemm_mac_counts(w_at_rest=True), and without any conversion for the maca); FAMILY and COSTS register
them with the kernel spec."""
from __future__ import annotations

import re

import numpy as np

from kernel_builder import block_float
from kernel_builder.external_costs import DEFAULT_STACK, CallWork, ExternalCost, bfp16_mmul
from kernel_builder.external_models import F32, need_memref
from kernel_builder.externals import ExternalFamily
from kernel_builder.gemm import external as gemm_ext
from kernel_builder.numerics import BF16
from kernel_builder.instr_counts import Counts, add_acc, conv, exp2, inv, load, scalar_bf16, vmac

W_FORMAT = "bfp16"
PARTS = ("zero", "mac", "out", "glu", "bias")
SYMBOL_RE = r"gemm_bfp_(zero|mac|maca|out|glu|outc|gluc)_bf16_m(\d+)_k(\d+)_n(\d+)"   # bias: kind gemm_bfp_bias
SYMBOL_RE_C = SYMBOL_RE.replace("gemm_bfp_", "gemm_bfpc_", 1)   # the object of C-in-block-float modules


def gemm_bfp_kernels(tile_m: int, tile_k: int, tile_n: int, a: str = "bf16",
                     c: str = "bf16") -> gemm_ext.GemmKernels:
    """zero / mac / out / glu / bias of one object; mac(a bf16 [tile_m*tile_k], w i8 [tile_n*tile_k*9/8], acc,
    scratch), or with a="bfp16" the object's maca(a i8 [tile_m*tile_k*9/8], w, acc) (kernel_builder/gemm/a_bfp.py)."""
    return gemm_ext.gemm_kernels(tile_m, tile_k, tile_n, W_FORMAT, a, c)


def tile_bytes(tile_k: int, tile_n: int) -> int:
    """Bytes of one L1 W tile: tile_n/8 x tile_k/8 blocks of 72 bytes."""
    return tile_n * tile_k * block_float.BLOCK_BYTES // 64


def w_tile(wb: np.ndarray, tile_k: int, step: int) -> np.ndarray:
    """The L1 W tile of K step `step` cut from at-rest bytes wb [tile_n/8, 9k] (what the module's DMAs deliver):
    its K chunks (gemm_ext.bfp_chunk_k) one after the other, each the at-rest encoding of its [tile_n, C] slice."""
    c = gemm_ext.bfp_chunk_k(tile_k)
    run, col = gemm_ext.BFP_COL_BYTES * c, gemm_ext.BFP_COL_BYTES * tile_k * step
    chunks = [wb[:, col + q * run:col + (q + 1) * run] for q in range(tile_k // c)]
    return np.ascontiguousarray(np.stack(chunks)).reshape(-1)


def tile_values(tile: np.ndarray, tk: int, tn: int) -> np.ndarray:
    """The [tn, tk] weights (f32) an L1 W tile holds: its chunks back in block-row order, block_float.decode."""
    c = gemm_ext.bfp_chunk_k(tk)
    rows = tile.view(np.uint8).reshape(tk // c, tn // 8, gemm_ext.BFP_COL_BYTES * c).transpose(1, 0, 2)
    return block_float.decode(np.ascontiguousarray(rows).reshape(tn // 8, -1), tn, tk)


def a_tile(ab: np.ndarray, tile_m: int, tile_k: int, step: int, row_block: int = 0) -> np.ndarray:
    """The L1 A tile (block-float A at rest, kernel_builder/gemm/a_bfp.py) of K step `step` and rows [8 row_block,
    +tile_m) cut from at-rest bytes ab [m/8, 9k]: the W tile's chunked order (what the module's DMAs deliver)."""
    return w_tile(ab[row_block:row_block + tile_m // 8], tile_k, step)


def gemm_bfp_model(part: str, tm: int, tk: int, tn: int):
    """The mac: the W tile decoded (block_float.decode: the tile is the at-rest encoding of its [tn, tk] slice),
    then gemm.cc's scalar accumulation (exact products, f32, ascending k); the other entry points are gemm.cc's."""
    if part == "maca":
        def maca(a, w, acc):
            af = tile_values(need_memref(a, "a", tile_bytes(tk, tm), "i8"), tk, tm)
            wf = tile_values(need_memref(w, "w", tile_bytes(tk, tn), "i8"), tk, tn)
            gemm_ext.mac_values(af, wf, acc, tm, tn)
        return maca
    if part in ("outc", "gluc"):
        return c_bfp_model(part, tm, tk, tn)
    if part != "mac":
        return gemm_ext.gemm_model(part, tm, tk, tn)

    def mac(a, w, acc, scratch):
        need_memref(scratch, "scratch", gemm_ext.scratch_elems(tm, tk))
        af = gemm_ext._unblock(need_memref(a, "a", tm * tk), tm, tk).astype(F32)
        wf = tile_values(need_memref(w, "w", tile_bytes(tk, tn), "i8"), tk, tn)
        gemm_ext.mac_values(af, wf, acc, tm, tn)
    return mac


def c_bfp_model(part: str, tm: int, tk: int, tn: int):
    """gemm_c_bfp.h's outc / gluc: the bf16 tile out / glu write (gemm.cc's model), then block_float.encode of it,
    stored as [tm/8][out_n/8] blocks of 72 bytes (the at-rest [tm/8, 9 out_n]) over the accumulator's front."""
    bf16_part = part[:-1]
    out_n = tn // 2 if bf16_part == "glu" else tn
    inner = gemm_ext.gemm_model(bf16_part, tm, tk, tn)

    def run(acc):
        gemm_ext._acc(acc, tm, tn)   # checks the memref (bf16 or the i8 of a block-float C module)
        tmp = _Bf16Tile(acc.data.view(np.uint8).view(BF16).copy())
        inner(tmp)
        vals = gemm_ext._unblock(tmp.data[:tm * out_n], tm, out_n).astype(F32)
        enc = block_float.encode(vals).reshape(-1)
        acc.data.view(np.uint8)[:enc.size] = enc
        acc.written = True
    return run


class _Bf16Tile:
    """A bf16 scratch copy of an accumulator for gemm.cc's epilogue models (what need_memref reads)."""

    def __init__(self, data: np.ndarray):
        self.data, self.dtype, self.written = data, "bf16", False


def c_bfp_counts(part: str, tm: int, tn: int) -> Counts:
    """One outc / gluc call (gemm_c_bfp.h): per 8x8 output block the two 32-lane steps of out / glu without their
    stores, one bfp16ebs8 conversion and one 72-byte block store (two 512-bit instructions); gluc adds glu's
    constants."""
    per_step = load(32, 4) + conv(2)
    if part == "outc":
        return (per_step * 2 + Counts(vconvert=1, bfp16_convert=1) + Counts(vstore=2, vstore_bytes=72)) * (tm * tn // 64)
    step = per_step * 2 + vmac(32) * 4 + exp2(32) + inv(32) + add_acc() + conv(5)
    block = step * 2 + Counts(vconvert=1, bfp16_convert=1) + Counts(vstore=2, vstore_bytes=72)
    return block * (tm * tn // 128) + scalar_bf16(3) + Counts(broadcast=1) + conv(1)


def _work(m, args):
    part, tm, tk, tn = m.group(1), int(m.group(2)), int(m.group(3)), int(m.group(4))
    if part == "outc":
        return CallWork(0, 0, c_bfp_counts(part, tm, tn))
    if part == "gluc":
        return CallWork(4 * tm * tn // 2, 0, c_bfp_counts(part, tm, tn))
    if part not in ("mac", "maca"):
        return gemm_ext.gemm_work(re.fullmatch(r"gemm_(\w+)_bf16_m(\d+)_k(\d+)_n(\d+)",
                                               f"gemm_{part}_bf16_m{tm}_k{tk}_n{tn}"), args)
    bfp = bfp16_mmul(gemm_bfp_kernels(tm, tk, tn).mac.defines)
    return CallWork(tm * tk * tn, 0, gemm_ext.gemm_mac_counts(tm, tk, tn, bfp, w_at_rest=True,
                                                              a_at_rest=part == "maca"))


def _cost(part: str, writes: tuple, pure: tuple = ()) -> ExternalCost:
    return ExternalCost(f"gemm_bfp_{part}", re.compile(rf"gemm_bfpc?_({part})_bf16_m(\d+)_k(\d+)_n(\d+)"), _work,
                        DEFAULT_STACK, writes, pure)


FAMILY = ExternalFamily("gemm_bfp", "gemm_bfp.cc", r"gemm_bfp_m(\d+)_k(\d+)_n(\d+)\.o", SYMBOL_RE,
                        lambda m, k, n: gemm_bfp_kernels(m, k, n).zero, gemm_bfp_model)
# the same source as the object of the modules writing C in block float (gemm/external.py gemm_kernels, c="bfp16")
FAMILY_C = ExternalFamily("gemm_bfpc", "gemm_bfp.cc", r"gemm_bfpc_m(\d+)_k(\d+)_n(\d+)\.o", SYMBOL_RE_C,
                          lambda m, k, n: gemm_bfp_kernels(m, k, n, c="bfp16").zero, gemm_bfp_model)
COSTS = (
    _cost("zero", (0,), (0,)),
    # mac(a, w, acc, scratch): writes the accumulator and the A scratch (the W tile is only read)
    _cost("mac", (2, 3)),
    _cost("maca", (2,)),   # maca(a, w, acc): A and W tiles only read
    _cost("out", (0,)),
    _cost("glu", (0,)),
    _cost("outc", (0,)),   # C in block float (gemm_c_bfp.h): the tile's 72-byte blocks over the accumulator
    _cost("gluc", (0,)),
)


def bias_family(kind: str) -> ExternalFamily:
    """The bias epilogue entry point of the same object, registered by the gemm_bfp_bias kind."""
    return ExternalFamily(kind, "gemm_bfp.cc", r"gemm_bfp_m(\d+)_k(\d+)_n(\d+)\.o",
                          r"gemm_bfp_(bias)_bf16_m(\d+)_k(\d+)_n(\d+)",
                          lambda m, k, n: gemm_bfp_kernels(m, k, n).bias, gemm_bfp_model)


BIAS_COSTS = (_cost("bias", (0,)),)
