"""The `gemm_swiglu` kernel: c = silu(a . w_gate^T) * (a . w_up^T) in ONE launch - the GEMM of
kernel_builder/gemm with the swiglu epilogue (each tile's W panel holds its gate rows and its up rows; the
epilogue combines the two halves of the accumulator in place). Builder, plan, micro-kernel and cost rows are the
gemm package's; this package registers the kind, its signature and its reference."""
from kernel_builder.gemm import builder, reference
from kernel_builder.spec import KernelSig, KernelSpec


def build(m: int, k: int, n: int) -> str:
    return builder.build(m, k, n, "swiglu")


SPEC = KernelSpec(KernelSig("gemm_swiglu", ("a", "w_gate", "w_up", "c")), build, reference.gemm_swiglu)
