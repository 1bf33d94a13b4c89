"""The `bias_add` kernel (y[r, :] = x[r, :] + b, a bias row broadcast over the rows): its builder, tiling plan,
reference and external-kernel descriptor (add.cc under its own symbol)."""
from kernel_builder.bias_add import builder, external, reference
from kernel_builder.spec import KernelSig, KernelSpec

SPEC = KernelSpec(KernelSig("bias_add", ("x", "b", "y")), builder.build, reference.bias_add, (external.FAMILY,),
                  external.COSTS)
