"""Tiling of the `gemv_bias` kernel: the GEMV's plan with the tile's bias rows in its x buffer
(kernel_builder.gemv.plan.plan_gemv(m, k, bias=True))."""
from __future__ import annotations

from kernel_builder.gemv.plan import GemvPlan, plan_gemv


def plan_gemv_bias(m: int, k: int) -> GemvPlan:
    return plan_gemv(m, k, bias=True)
