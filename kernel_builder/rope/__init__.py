"""The `rope` kernel: its builder, tiling plan, reference and external-kernel descriptor."""
from kernel_builder.rope import builder, external, reference
from kernel_builder.spec import KernelSig, KernelSpec

SPEC = KernelSpec(KernelSig("rope", ("x", "lut", "y")),
                  builder.build, reference.rope, (external.FAMILY,), external.COSTS)
