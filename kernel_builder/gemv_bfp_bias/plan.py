"""Tiling of the `gemv_bfp_bias` kernel: the block-float GEMV's plan with the tile's bias rows in its x buffer
(kernel_builder.gemv_bfp.plan.plan_gemv_bfp(m, k, bias=True))."""
from __future__ import annotations

from kernel_builder.gemv.plan import GemvPlan
from kernel_builder.gemv_bfp.plan import plan_gemv_bfp


def plan_gemv_bfp_bias(m: int, k: int) -> GemvPlan:
    return plan_gemv_bfp(m, k, bias=True)
