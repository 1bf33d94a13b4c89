"""The `bias_add` kernel's tiling plan: whole rows per step (the bias row is one L1 buffer of `dim` elements, added
to one row of x per call), or a ValueError naming the dimension and the NPU2 limit."""
from __future__ import annotations

from kernel_builder.add.external import ADD_N_MULTIPLE
from kernel_builder.planner import L1_BUDGET, RowPlan, check_positive, flat_plan, kib


def plan_bias_add(rows: int, dim: int) -> RowPlan:
    """Herd [herd, 1]; tile t owns rows [t*units_per_tile, (t+1)*units_per_tile) and adds the bias to one row per
    step (x and b DMA-filled, ping-ponged when a tile has two rows or more; y written by the call)."""
    check_positive("bias_add", rows=rows, dim=dim)
    if dim % ADD_N_MULTIPLE:
        raise ValueError(f"bias_add: dim={dim} must be a multiple of {ADD_N_MULTIPLE} "
                         f"(AIE2P 32-lane bf16 vector path of the add kernel)")
    plan = flat_plan("bias_add", rows, dim, (("x", 1), ("b", 1)), ADD_N_MULTIPLE, dim, "rows")
    if plan is None:
        raise ValueError(f"bias_add: a row of dim={dim} with its bias row (double-buffered) and the output row "
                         f"does not fit {kib(L1_BUDGET)} of L1")
    return plan
