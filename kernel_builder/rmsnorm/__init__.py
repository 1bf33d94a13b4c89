"""The `rmsnorm` kernel: its builder, tiling plan, reference and external-kernel descriptor."""
from kernel_builder.rmsnorm import builder, external, reference
from kernel_builder.spec import KernelSig, KernelSpec

SPEC = KernelSpec(KernelSig("rmsnorm", ("x", "w", "y")),
                  builder.build, reference.rmsnorm, (external.FAMILY,), external.COSTS)
