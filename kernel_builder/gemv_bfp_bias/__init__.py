"""The `gemv_bfp_bias` kernel (y = W x + b on block-float weights: a decode projection with its bias, or the
residual as the bias, in one launch): the block-float GEMV's builder, plan and C++ source with the bias epilogue
(kernel_builder.gemv_bfp, external_kernels/gemv_bfp.cc GBFP_BIAS)."""
from kernel_builder.gemv_bfp_bias import builder, external, reference
from kernel_builder.spec import KernelSig, KernelSpec

SPEC = KernelSpec(KernelSig("gemv_bfp_bias", ("w", "x", "b", "y")), builder.build, reference.gemv_bfp_bias,
                  (external.FAMILY,), external.COSTS)
