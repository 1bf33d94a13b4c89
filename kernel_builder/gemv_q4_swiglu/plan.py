"""Tiling of the `gemv_q4_swiglu` kernel: the 4-bit GEMV's plan with 2R weight rows per tile (R gate, R up) into
y_l1 [2R] and R SwiGLU outputs (a multiple of 32: the vector path) in act_l1."""
from __future__ import annotations

from kernel_builder.gemv_q4.plan import GemvQ4Plan, plan_gemv_q4


def plan_gemv_q4_swiglu(m: int, k: int, group: int, mins: int) -> GemvQ4Plan:
    return plan_gemv_q4(m, k, group, mins, swiglu=True)
