"""Block-float GEMV with a bias epilogue (kernel_builder.gemv_bfp.builder with `bias`: each tile's bias rows follow
x on its stream, in x's one transfer; the last K chunk adds them to the f32 sums before the one rounding)."""
from __future__ import annotations

from kernel_builder.gemv_bfp import builder as bfp_builder

KIND = "gemv_bfp_bias"


def build(m: int, k: int) -> str:
    return bfp_builder.build(m, k, bias=True)   # plan: gemv_bfp.plan.plan_gemv_bfp(m, k, bias=True)
