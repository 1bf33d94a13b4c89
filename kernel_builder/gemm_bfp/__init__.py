"""The `gemm_bfp` kernel: the prefill GEMM c = a . W^T (epilogue "none" or "swiglu") with W at rest in block float
(bfp16ebs8, kernel_builder/block_float.py: 9 bits per weight, converted once on the host at load). The module is
kernel_builder/gemm's with the "bfp16" W format; the micro-kernel external_kernels/gemm_bfp.cc (gemm.cc included)
reads the W tile's 72-byte blocks as stored, with the numerics of the bf16 path's vector micro-kernel."""
from kernel_builder.gemm_bfp import builder, external, reference
from kernel_builder.spec import KernelSig, KernelSpec

SPEC = KernelSpec(KernelSig("gemm_bfp", ("a", "w", "c")), builder.build, reference.gemm_bfp, (external.FAMILY, external.FAMILY_C),
                  external.COSTS)
