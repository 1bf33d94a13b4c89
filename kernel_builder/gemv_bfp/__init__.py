"""The `gemv_bfp` kernel: the decode GEMV on weights at rest in block float (bfp16ebs8, kernel_builder.block_float),
consumed by AIE2P's block-float matrix unit."""
from kernel_builder.gemv_bfp import builder, external, reference
from kernel_builder.spec import KernelSig, KernelSpec

SPEC = KernelSpec(KernelSig("gemv_bfp", ("w", "x", "y")),
                  builder.build, reference.gemv_bfp, (external.FAMILY,), external.COSTS)
