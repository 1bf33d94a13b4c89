"""The `geglu` kernel's tiling plan: the elementwise row plan of kernel_builder.planner (as swiglu's)."""
from __future__ import annotations

from kernel_builder.geglu.external import GEGLU_N_MULTIPLE
from kernel_builder.planner import RowPlan, plan_elementwise


def plan_geglu(rows: int, dim: int) -> RowPlan:
    return plan_elementwise("geglu", rows, dim, ("gate", "up"), GEGLU_N_MULTIPLE)
