"""The `geglu` kernel (GeGLU with the tanh-approximated GELU, Gemma): builder, tiling plan, reference and
external-kernel descriptor."""
from kernel_builder.geglu import builder, external, reference
from kernel_builder.spec import KernelSig, KernelSpec

SPEC = KernelSpec(KernelSig("geglu", ("gate", "up", "y")),
                  builder.build, reference.geglu, (external.FAMILY,), external.COSTS)
