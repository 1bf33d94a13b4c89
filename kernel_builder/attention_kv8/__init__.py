"""The `attention_kv8` kernel: decode attention over the KV8 cache (int8 codes + power-of-two f32 scales per
position and kv head; kernel_builder/kv_quant writes it)."""
from kernel_builder.attention_kv8 import builder, external, reference
from kernel_builder.spec import KernelSig, KernelSpec

SPEC = KernelSpec(KernelSig("attention_kv8", ("q", "kv", "pos", "o")),
                  builder.build, reference.attention_kv8, (external.FAMILY,), external.COSTS)
