"""The `gemm_bfp_bias` kernel's builder: the GEMM module of kernel_builder/gemm/builder.py with the "bfp16" W format
and the bias epilogue: arguments (a bf16 [m, k], w i8 [n/8, 9k], b bf16 [1, n], c bf16 [m, n])."""
from __future__ import annotations

from kernel_builder.gemm import builder as gemm_builder
from kernel_builder.gemm_bfp.builder import check


def build(m: int, k: int, n: int) -> str:
    check(m, k, n, "bias", "gemm_bfp_bias")
    return gemm_builder.build(m, k, n, "bias", "bfp16")
