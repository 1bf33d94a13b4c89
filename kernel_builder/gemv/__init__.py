"""The `gemv` kernel: its builder, tiling plan, reference and external-kernel descriptor."""
from kernel_builder.gemv import builder, external, reference
from kernel_builder.spec import KernelSig, KernelSpec

SPEC = KernelSpec(KernelSig("gemv", ("w", "x", "y")),
                  builder.build, reference.gemv, (external.FAMILY,), external.COSTS)
