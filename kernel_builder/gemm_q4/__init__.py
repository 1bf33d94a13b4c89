"""The `gemm_q4` kernel: the prefill GEMM on 4-bit weights dequantized tile by tile in L1 (docs/quantization.md,
"Prefill")."""
from kernel_builder.gemm_q4 import builder, external, reference
from kernel_builder.spec import KernelSig, KernelSpec

SPEC = KernelSpec(KernelSig("gemm_q4", ("a", "w", "c")),
                  builder.build, reference.gemm_q4, (external.FAMILY,), external.COSTS)
