"""The `gemv_q4` kernel: GEMV streaming group-quantized 4-bit weights (format.py), dequantized in the core."""
from kernel_builder.gemv_q4 import builder, external, reference
from kernel_builder.spec import KernelSig, KernelSpec

SPEC = KernelSpec(KernelSig("gemv_q4", ("w", "x", "y")),
                  builder.build, reference.gemv_q4, (external.FAMILY,), external.COSTS)
