"""The `gemm_q4` kernel's external C++ kernel (external_kernels/gemm_q4.cc, which includes gemm.cc): its shapes and
symbols, the numpy model of its portable path for the interpreter, and its cost descriptor (the dequantization of
the W slice, counted as dequant_q4's vector path per weight plus four 8-lane stores per 32 weights, plus gemm.cc's
mac at the same tile); FAMILY and COSTS register them with the kernel spec."""
from __future__ import annotations

import re
from typing import NamedTuple

import numpy as np

from external_kernels.compile_rules import ExternalKernel
from kernel_builder.external_costs import DEFAULT_STACK, CallWork, ExternalCost, bfp16_mmul
from kernel_builder.external_models import need_memref
from kernel_builder.externals import ExternalFamily
from kernel_builder.gemm import external as gemm_ext
from kernel_builder.gemv_q4.format import Q4Layout, dequantize
from kernel_builder.instr_counts import Counts, add_acc, conv, load, store, vmac

PARTS = ("zero", "mac", "out")     # gemm.cc's entry points this object carries (renamed: no clash with gemm.o)


class GemmQ4Kernels(NamedTuple):
    zero: ExternalKernel
    mac: ExternalKernel      # mac(a, wq, acc, scratch, wst): dequantize wq into wst, then gemm.cc's mac
    out: ExternalKernel

    @property
    def obj(self) -> str:
        return self.zero.obj


def slice_bytes(tile_k: int, tile_n: int, group: int) -> int:
    """Bytes of one L1 W slice: the codes of tile_n rows over tile_k columns, then each row's scales and mins."""
    return tile_n * (tile_k // 2 + 4 * (tile_k // group))


def gemm_q4_kernels(tile_m: int, tile_k: int, tile_n: int, group: int) -> GemmQ4Kernels:
    base = gemm_ext.gemm_kernels(tile_m, tile_k, tile_n)      # the shape checks and gemm.cc's defines
    if tile_k % (2 * group):
        raise ValueError(f"gemm_q4: tile_k={tile_k} must be a multiple of 2 x group {group} (a row's scales of one "
                         f"slice are whole 32-bit DMA words)")
    tag = f"m{tile_m}_k{tile_k}_n{tile_n}_g{group}"
    syms = {part: f"gemmq4_{part}_bf16_{tag}" for part in ("zero", "mac", "out", "glu", "bias", "inner")}
    renamed = {f"GEMM_{p.upper()}_SYMBOL": syms["inner" if p == "mac" else p] for p in ("zero", "mac", "out", "glu", "bias")}
    defines = tuple((n, renamed.get(n, v)) for n, v in base.mac.defines) + (("GQ4_G", str(group)),
                                                                            ("GQ4_SYMBOL", syms["mac"]))
    obj = f"gemmq4_{tag}.o"
    return GemmQ4Kernels(*(ExternalKernel(symbol=syms[p], obj=obj, source="gemm_q4.cc", defines=defines)
                           for p in PARTS))


def _dequant_blocked(wq: np.ndarray, tk: int, tn: int, group: int) -> np.ndarray:
    """The slice's bf16 tile [tn, tk] (gemm_q4.cc's dequantization: format.dequantize of the rows it holds)."""
    b = wq.view(np.uint8)
    codes = b[:tn * tk // 2].reshape(tn, tk // 2)
    sm = b[tn * tk // 2:].reshape(tn, 4 * (tk // group))
    lay = Q4Layout(tk, group, True)
    rows = np.zeros((tn, lay.row_bytes), np.uint8)  # the slice's rows as q4 rows of k = tk (padded)
    rows[:, :lay.used_bytes] = np.concatenate([codes, sm], axis=1)
    return dequantize(rows, tk, group, True)


def gemm_q4_model(part: str, tm: int, tk: int, tn: int, group: int):
    """zero / out: gemm.cc's; mac: the slice dequantized (format.dequantize) into the blocked W tile, then gemm.cc's
    mac on it."""
    if part != "mac":
        return gemm_ext.gemm_model(part, tm, tk, tn)
    inner = gemm_ext.gemm_model("mac", tm, tk, tn)

    def mac(a, wq, acc, scratch, wst):
        w = _dequant_blocked(need_memref(wq, "wq", slice_bytes(tk, tn, group), "i8"), tk, tn, group)
        out = need_memref(wst, "wst", tn * tk)
        out[:] = gemm_ext._block(w)
        wst.written = True
        inner(a, wst, acc, scratch)
    return mac


def dequant_counts(tk: int, tn: int, group: int) -> Counts:
    """gemm_q4.cc's dequantization of one slice: per 32 weights a 16-byte code load, unpack, to_float (2
    conversions + 2 accumulator adds), d*q, the add of the broadcast min (a widening + an add), the RNE
    conversion and four 8-lane (16-byte) stores; per group one broadcast."""
    per32 = (load(16, 1) + Counts(unpack=1) + conv(2) + add_acc(2) + vmac(32) + conv() + conv() + add_acc()
             + store(8, 2) * 4)
    return ((tk // 32) * per32 + (tk // group) * Counts(broadcast=1)) * tn


def _gemm_q4(m, args):
    part, tm, tk, tn, g = m.group(1), int(m.group(2)), int(m.group(3)), int(m.group(4)), int(m.group(5))
    if part != "mac":
        return gemm_ext.gemm_work(re.fullmatch(r"gemm_(\w+)_bf16_m(\d+)_k(\d+)_n(\d+)",
                                               f"gemm_{part}_bf16_m{tm}_k{tk}_n{tn}"), args)
    bfp = bfp16_mmul(gemm_q4_kernels(tm, tk, tn, g).mac.defines)
    return CallWork(tm * tk * tn, 0, gemm_ext.gemm_mac_counts(tm, tk, tn, bfp) + dequant_counts(tk, tn, g))


SYMBOL_RE = r"gemmq4_(zero|mac|out)_bf16_m(\d+)_k(\d+)_n(\d+)_g(\d+)"
FAMILY = ExternalFamily("gemm_q4", "gemm_q4.cc", r"gemmq4_m(\d+)_k(\d+)_n(\d+)_g(\d+)\.o", SYMBOL_RE,
                        lambda m, k, n, g: gemm_q4_kernels(m, k, n, g).zero, gemm_q4_model)
COSTS = (
    ExternalCost("gemm_q4_zero", re.compile(r"gemmq4_(zero)_bf16_m(\d+)_k(\d+)_n(\d+)_g(\d+)"), _gemm_q4,
                 DEFAULT_STACK, (0,), (0,)),
    # mac(a, wq, acc, scratch, wst): writes acc, the block-float scratch and the dequantized tile
    ExternalCost("gemm_q4_mac", re.compile(r"gemmq4_(mac)_bf16_m(\d+)_k(\d+)_n(\d+)_g(\d+)"), _gemm_q4,
                 DEFAULT_STACK, (2, 3, 4), (4,)),
    ExternalCost("gemm_q4_out", re.compile(r"gemmq4_(out)_bf16_m(\d+)_k(\d+)_n(\d+)_g(\d+)"), _gemm_q4,
                 DEFAULT_STACK, (0,)),
)
