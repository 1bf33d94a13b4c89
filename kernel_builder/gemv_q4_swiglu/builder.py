"""4-bit gate and up GEMVs with the SwiGLU epilogue (kernel_builder.gemv_q4.builder with `swiglu`: each tile's
stream carries x, its gate rows, then its up rows; the tile writes silu(gate) * up for its rows)."""
from __future__ import annotations

from kernel_builder.gemv_q4 import builder as q4_builder

KIND = "gemv_q4_swiglu"


def build(m: int, k: int, group: int = 32, mins: int = 1) -> str:
    return q4_builder.build(m, k, group, mins, swiglu=True)   # plan: gemv_q4_swiglu.plan.plan_gemv_q4_swiglu
