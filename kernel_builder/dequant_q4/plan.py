"""The `dequant_q4` kernel's plan: one tile, the rows in L1 (a ValueError past the budget)."""
from __future__ import annotations

from kernel_builder.dequant_q4.external import dequant_q4_kernel
from kernel_builder.gemv_q4.format import Q4Layout
from kernel_builder.planner import BF16, L1_BUDGET, check_positive, kib


def plan_dequant_q4(rows: int, k: int, group: int, mins: int) -> int:
    """L1 bytes of the one tile (the q4 rows and their bf16 rows)."""
    check_positive("dequant_q4", rows=rows, k=k)
    dequant_q4_kernel(k, group, mins, rows)
    need = rows * (Q4Layout(k, group, bool(mins)).row_bytes + BF16 * k)
    if need > L1_BUDGET:
        raise ValueError(f"dequant_q4: {rows} rows of k={k} need {kib(need)} of L1, the budget is {kib(L1_BUDGET)}")
    return need
