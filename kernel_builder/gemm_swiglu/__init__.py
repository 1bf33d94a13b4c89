"""The `gemm_swiglu` kernel: c = silu(a . w_gate^T) * (a . w_up^T) in ONE launch - the GEMM of kernel_builder/gemm
with the swiglu epilogue (each tile's W panel holds its gate rows and its up rows, loaded by two DMAs; the epilogue
combines the two halves of the accumulator in place). Builder, plan, micro-kernel and costs are the gemm
package's with that epilogue."""
from kernel_builder.gemm_swiglu import builder, external, reference
from kernel_builder.spec import KernelSig, KernelSpec

SPEC = KernelSpec(KernelSig("gemm_swiglu", ("a", "w_gate", "w_up", "c")), builder.build, reference.gemm_swiglu,
                  (external.FAMILY,), external.COSTS)
