"""The `gemv_q4_swiglu` kernel (y = silu(dequantize(W_gate) x) * (dequantize(W_up) x): a 4-bit decode's gate and up
projections and their SwiGLU in ONE launch): the 4-bit GEMV's builder and plan with two weight matrices on each
tile's stream and gemv_q4.cc's Q4_SWIGLU entry (swiglu.cc's code) on the tile's outputs."""
from kernel_builder.gemv_q4_swiglu import builder, external, reference
from kernel_builder.spec import KernelSig, KernelSpec

SPEC = KernelSpec(KernelSig("gemv_q4_swiglu", ("w_gate", "w_up", "x", "y")), builder.build,
                  reference.gemv_q4_swiglu, (external.FAMILY,), external.COSTS)
