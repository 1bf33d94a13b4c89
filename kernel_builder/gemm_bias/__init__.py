"""The `gemm_bias` kernel: c = a . w^T + b (b: the [1, n] bias row) in ONE launch - the GEMM of
kernel_builder/gemm with the bias epilogue (a herd column's bias slice arrives once down its W channel; the
epilogue adds it to the f32 accumulator before the one bf16 rounding). Builder, plan, micro-kernel and cost rows
are the gemm package's; this package registers the kind, its signature and its reference."""
from kernel_builder.gemm import builder, reference
from kernel_builder.spec import KernelSig, KernelSpec


def build(m: int, k: int, n: int) -> str:
    return builder.build(m, k, n, "bias")


SPEC = KernelSpec(KernelSig("gemm_bias", ("a", "w", "b", "c")), build, reference.gemm_bias)
