"""The `gemm_bias` kernel: c = a . w^T + b (b: the [1, n] bias row) in ONE launch - the GEMM of kernel_builder/gemm
with the bias epilogue (a herd column's bias slice arrives once down its W channel; the epilogue adds it to the
f32 accumulator before the one bf16 rounding). Builder, plan, micro-kernel and costs are the gemm package's with
that epilogue."""
from kernel_builder.gemm_bias import builder, external, reference
from kernel_builder.spec import KernelSig, KernelSpec

SPEC = KernelSpec(KernelSig("gemm_bias", ("a", "w", "b", "c")), builder.build, reference.gemm_bias,
                  (external.FAMILY,), external.COSTS)
