"""The `gemv_bias` kernel (y = W x + b: a decode projection with its bias in one launch): the GEMV's builder,
plan and C++ source with the bias epilogue (kernel_builder.gemv, external_kernels/gemv.cc GEMV_BIAS)."""
from kernel_builder.gemv_bias import builder, external, reference
from kernel_builder.spec import KernelSig, KernelSpec

SPEC = KernelSpec(KernelSig("gemv_bias", ("w", "x", "b", "y")), builder.build, reference.gemv_bias,
                  (external.FAMILY,), external.COSTS)
