"""The `gemm_bias` kernel's tiling plan: the gemm planner with the bias epilogue (kernel_builder/gemm/plan.py)."""
from __future__ import annotations

from kernel_builder.gemm.plan import GemmPlan, plan_gemm


def plan(m: int, k: int, n: int) -> GemmPlan:
    return plan_gemm(m, k, n, "bias")
