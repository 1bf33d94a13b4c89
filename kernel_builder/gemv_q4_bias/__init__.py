"""The `gemv_q4_bias` kernel (y = dequantize(W) x + b: a 4-bit decode projection and its bias in ONE launch): the
4-bit GEMV's builder, plan and C++ source with the bias epilogue (kernel_builder.gemv_q4, gemv_q4.cc Q4_BIAS)."""
from kernel_builder.gemv_q4_bias import builder, external, reference
from kernel_builder.spec import KernelSig, KernelSpec

SPEC = KernelSpec(KernelSig("gemv_q4_bias", ("w", "x", "b", "y")), builder.build, reference.gemv_q4_bias,
                  (external.FAMILY,), external.COSTS)
