"""The `gemm` kernel: its builder, tiling plan, reference and external-kernel descriptor."""
from kernel_builder.gemm import builder, external, reference
from kernel_builder.spec import KernelSig, KernelSpec

SPEC = KernelSpec(KernelSig("gemm", ("a", "w", "c")),
                  builder.build, reference.gemm, (external.FAMILY,), external.COSTS)
