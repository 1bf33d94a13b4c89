"""The `bias_add` kernel (y[r, :] = x[r, :] + b, a bias row broadcast over the rows): its builder, tiling plan and
reference. Its external C++ kernel is `add`'s (external_kernels/add.cc: one row of x plus the bias row), so the
external family and cost row are the `add` kernel's (registered there once)."""
from kernel_builder.bias_add import builder, reference
from kernel_builder.spec import KernelSig, KernelSpec

SPEC = KernelSpec(KernelSig("bias_add", ("x", "b", "y")), builder.build, reference.bias_add)
