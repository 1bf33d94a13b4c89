"""The `swiglu` kernel's tiling plan (SwiGLU): the integers its builder needs, or a ValueError naming
the dimension and the NPU2 limit."""
from __future__ import annotations

from kernel_builder.planner import RowPlan, plan_elementwise
from kernel_builder.swiglu.external import SWIGLU_N_MULTIPLE


def plan_swiglu(rows: int, dim: int) -> RowPlan:
    return plan_elementwise("swiglu", rows, dim, ("gate", "up"), SWIGLU_N_MULTIPLE)
