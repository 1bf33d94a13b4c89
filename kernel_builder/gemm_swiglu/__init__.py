"""The `gemm_swiglu` kernel: c = silu(a . w_gate^T) * (a . w_up^T) in ONE launch - the GEMM of kernel_builder/gemm
with the swiglu epilogue. w is ONE [2n, k] weight, the gate and up rows interleaved by 8 (layout.py), so each
tile's W panel is one contiguous L3 DMA; the epilogue combines the accumulator's (gate, up) column-block pairs in
place. Builder, plan, micro-kernel and costs are the gemm
package's with that epilogue."""
from kernel_builder.gemm_swiglu import builder, external, reference
from kernel_builder.spec import KernelSig, KernelSpec

SPEC = KernelSpec(KernelSig("gemm_swiglu", ("a", "w", "c")), builder.build, reference.gemm_swiglu,
                  (external.FAMILY,), external.COSTS)
