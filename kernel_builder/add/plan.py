"""The `add` kernel's tiling plan (residual add): the integers its builder needs, or a ValueError naming
the dimension and the NPU2 limit."""
from __future__ import annotations

from kernel_builder.add.external import ADD_N_MULTIPLE
from kernel_builder.planner import RowPlan, plan_elementwise


def plan_add(rows: int, dim: int) -> RowPlan:
    return plan_elementwise("add", rows, dim, ("a", "b"), ADD_N_MULTIPLE)
