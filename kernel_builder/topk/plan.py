"""The `topk` kernel's plan: one tile holds the whole logits partition in L1 (a ValueError past the budget)."""
from __future__ import annotations

from dataclasses import dataclass

from kernel_builder.planner import BF16, L1_BUDGET, check_positive, kib
from kernel_builder.topk.external import block_of, topk_kernel


@dataclass(frozen=True)
class TopkPlan:
    n: int
    k: int
    block: int

    def l1_bytes(self) -> int:
        return BF16 * self.n + 2 * (2 * self.k * 4)


def plan_topk(n: int, k: int, base: int, valid: int) -> TopkPlan:
    check_positive("topk", n=n, k=k, valid=valid)
    topk_kernel(n, k, base, valid)          # the kernel's own limits
    plan = TopkPlan(n, k, block_of(n))
    if plan.l1_bytes() > L1_BUDGET:
        raise ValueError(f"topk: a partition of n={n} logits needs {kib(plan.l1_bytes())} of L1, the budget is "
                         f"{kib(L1_BUDGET)}: split the vocabulary into more partitions")
    return plan
