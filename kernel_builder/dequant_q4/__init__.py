"""The `dequant_q4` kernel: its builder, plan, reference and external-kernel descriptor."""
from kernel_builder.dequant_q4 import builder, external, reference
from kernel_builder.spec import KernelSig, KernelSpec

SPEC = KernelSpec(KernelSig("dequant_q4", ("w", "y")),
                  builder.build, reference.dequant_q4, (external.FAMILY,), external.COSTS)
