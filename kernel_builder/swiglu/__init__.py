"""The `swiglu` kernel: its builder, tiling plan, reference and external-kernel descriptor."""
from kernel_builder.swiglu import builder, external, reference
from kernel_builder.spec import KernelSig, KernelSpec

SPEC = KernelSpec(KernelSig("swiglu", ("gate", "up", "y")),
                  builder.build, reference.swiglu, (external.FAMILY,), external.COSTS)
