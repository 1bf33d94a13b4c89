"""Tiling of the `gemv_q4_bias` kernel: the 4-bit GEMV's plan with the tile's bias rows in its x buffer."""
from __future__ import annotations

from kernel_builder.gemv_q4.plan import GemvQ4Plan, plan_gemv_q4


def plan_gemv_q4_bias(m: int, k: int, group: int, mins: int) -> GemvQ4Plan:
    return plan_gemv_q4(m, k, group, mins, bias=True)
