"""The `gemm_bias` kernel's external C++ kernel: the `bias` epilogue entry point of external_kernels/gemm.cc (one
object with the gemm kernel's zero / mac / out, compiled once per tile shape); its numpy model and cost rows are
kernel_builder/gemm/external.py's. FAMILY and COSTS register the entry point with this kind."""
from __future__ import annotations

from kernel_builder.gemm.external import epilogue_costs, epilogue_family

FAMILY = epilogue_family("gemm_bias", "bias")
COSTS = epilogue_costs("gemm_bias", "bias")
