"""The `rmsnorm` kernel: its builder, tiling plan, reference and external-kernel descriptor."""
from kernel_builder.rmsnorm import bfp_external, builder, external, reference
from kernel_builder.spec import KernelSig, KernelSpec

SPEC = KernelSpec(KernelSig("rmsnorm", ("x", "w", "y")),
                  builder.build, reference.rmsnorm, (external.FAMILY, bfp_external.FAMILY),
                  external.COSTS + bfp_external.COSTS)
