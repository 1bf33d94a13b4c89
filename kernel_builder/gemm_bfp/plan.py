"""The `gemm_bfp` kernel's tiling plan: the gemm planner (kernel_builder/gemm/plan.py) with the W format "bfp16"
(72 bytes per 8x8 W block in L3, L2 and L1 instead of 128: it picks the fastest fitting plan for those bytes)."""
from __future__ import annotations

from kernel_builder.gemm.plan import GemmPlan, plan_gemm
from kernel_builder.gemm_bfp.builder import check


def plan(m: int, k: int, n: int, epilogue: str = "none", a: str = "bf16", c: str = "bf16") -> GemmPlan:
    check(m, k, n, epilogue)
    return plan_gemm(m, k, n, epilogue, w_format="bfp16", a_format=a, c_format=c)
