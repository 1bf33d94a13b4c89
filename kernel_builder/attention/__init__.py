"""The `attention` kernel: its builder, tiling plan, reference and external-kernel descriptor."""
from kernel_builder.attention import builder, external, reference
from kernel_builder.spec import KernelSig, KernelSpec

SPEC = KernelSpec(KernelSig("attention", ("q", "k", "v", "pos", "o")),
                  builder.build, reference.attention, (external.FAMILY,), external.COSTS)
