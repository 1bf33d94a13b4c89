"""The `gemm_bfp_bias` kernel's tiling plan: the gemm planner with the "bfp16" W format and the bias epilogue."""
from __future__ import annotations

from kernel_builder.gemm.plan import GemmPlan, plan_gemm
from kernel_builder.gemm_bfp.builder import check


def plan(m: int, k: int, n: int) -> GemmPlan:
    check(m, k, n, "bias", "gemm_bfp_bias")
    return plan_gemm(m, k, n, "bias", w_format="bfp16")
