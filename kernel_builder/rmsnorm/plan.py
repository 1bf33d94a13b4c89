"""The `rmsnorm` kernel's tiling plan (RMSNorm): the integers its builder needs, or a ValueError naming
the dimension and the NPU2 limit."""
from __future__ import annotations

from kernel_builder.planner import BF16, L1_BUDGET, MAX_ELEMWISE_CHUNK, RowPlan, check_positive, flat_plan, kib
from kernel_builder.rmsnorm.external import RMSNORM_GROUP_MULTIPLE


def plan_rmsnorm(rows: int, dim: int, group: int = 0) -> RowPlan:
    check_positive("rmsnorm", rows=rows, dim=dim)
    g = group or dim
    if dim % g:
        raise ValueError(f"rmsnorm: group={group} does not divide dim={dim}")
    if g % RMSNORM_GROUP_MULTIPLE:
        raise ValueError(f"rmsnorm: group={g} must be a multiple of {RMSNORM_GROUP_MULTIPLE} "
                         f"(32-lane bf16 vector path of the external kernel)")
    plan = flat_plan("rmsnorm", rows * (dim // g), g, (("x", g), ("w", 0)), RMSNORM_GROUP_MULTIPLE,
                      max(g, MAX_ELEMWISE_CHUNK), "groups")
    if plan is None:
        raise ValueError(f"rmsnorm: dim={dim} needs {kib(5 * BF16 * g)} of L1 per tile for one group of {g} "
                         f"elements (x and w double-buffered, y); the NPU2 limit is {kib(L1_BUDGET)}")
    # the weight is one [group] buffer per step, not chunk-sized
    return RowPlan(plan.herd, plan.units_per_tile, plan.chunk, plan.unit, g, (("x", plan.chunk * g), ("w", g)))
