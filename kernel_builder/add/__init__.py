"""The `add` kernel: its builder, tiling plan, reference and external-kernel descriptor."""
from kernel_builder.add import builder, external, reference
from kernel_builder.spec import KernelSig, KernelSpec

SPEC = KernelSpec(KernelSig("add", ("a", "b", "y")),
                  builder.build, reference.add, (external.FAMILY,), external.COSTS)
