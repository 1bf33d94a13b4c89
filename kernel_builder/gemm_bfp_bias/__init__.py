"""The `gemm_bfp_bias` kernel: c = a . W^T + b (b: the [1, n] bias row, Qwen-style projections) with W at rest in
block float - the gemm_bfp module (kernel_builder/gemm_bfp) with gemm.cc's bias epilogue (the bias slice of a herd
column sent once down its W channel before the K slices, added to the f32 accumulator before the one rounding)."""
from kernel_builder.gemm_bfp_bias import builder, external, reference
from kernel_builder.spec import KernelSig, KernelSpec

SPEC = KernelSpec(KernelSig("gemm_bfp_bias", ("a", "w", "b", "c")), builder.build, reference.gemm_bfp_bias,
                  (external.FAMILY,), external.COSTS)
