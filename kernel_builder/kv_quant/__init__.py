"""The `kv_quant` kernel: the KV8 cache writer (K or V rows -> int8 codes + per (position, head) scales)."""
from kernel_builder.kv_quant import builder, external, reference
from kernel_builder.spec import KernelSig, KernelSpec

SPEC = KernelSpec(KernelSig("kv_quant", ("x", "kv"), inplace=("kv",)),
                  builder.build, reference.kv_quant, (external.FAMILY,), external.COSTS)
