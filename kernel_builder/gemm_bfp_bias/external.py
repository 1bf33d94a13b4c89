"""The `gemm_bfp_bias` kernel's external C++ kernel: the `bias` epilogue entry point of external_kernels/gemm_bfp.cc
(one object with gemm_bfp's zero / mac, compiled once per tile shape); its numpy model and cost row are
kernel_builder/gemm_bfp/external.py's. FAMILY and COSTS register the entry point with this kind."""
from __future__ import annotations

from kernel_builder.gemm_bfp.external import BIAS_COSTS, bias_family

FAMILY = bias_family("gemm_bfp_bias")
COSTS = BIAS_COSTS
