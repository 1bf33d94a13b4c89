"""4-bit GEMV with a bias epilogue (kernel_builder.gemv_q4.builder with `bias`: each tile's bias rows follow x on
its stream, in x's one transfer; the kernel adds them to the f32 sums before the one rounding)."""
from __future__ import annotations

from kernel_builder.gemv_q4 import builder as q4_builder

KIND = "gemv_q4_bias"


def build(m: int, k: int, group: int = 32, mins: int = 1) -> str:
    return q4_builder.build(m, k, group, mins, bias=True)   # plan: gemv_q4_bias.plan.plan_gemv_q4_bias
