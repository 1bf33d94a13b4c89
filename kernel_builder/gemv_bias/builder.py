"""GEMV with a bias epilogue: y[0, i] = sum_k w[i, k] * x[0, k] + b[0, i] (kernel_builder.gemv.builder with
`bias`: each tile's bias rows follow x on its stream; the last K chunk adds them before the one rounding)."""
from __future__ import annotations

from kernel_builder.gemv import builder as gemv_builder

KIND = "gemv_bias"


def build(m: int, k: int) -> str:
    return gemv_builder.build(m, k, bias=True)   # plan: gemv_bias.plan.plan_gemv_bias
