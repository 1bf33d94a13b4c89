"""The `gemm_bias` kernel's builder: the GEMM module of kernel_builder/gemm/builder.py with the bias epilogue."""
from __future__ import annotations

from kernel_builder.gemm import builder as gemm_builder


def build(m: int, k: int, n: int) -> str:
    return gemm_builder.build(m, k, n, "bias")
