"""The `topk` kernel: its builder, plan, reference and external-kernel descriptor."""
from kernel_builder.spec import KernelSig, KernelSpec
from kernel_builder.topk import builder, external, reference

SPEC = KernelSpec(KernelSig("topk", ("logits", "prev", "out")),
                  builder.build, reference.topk, (external.FAMILY,), external.COSTS)
