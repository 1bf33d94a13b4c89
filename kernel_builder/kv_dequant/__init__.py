"""The `kv_dequant` kernel: KV8 cache rows -> bf16 K and V rows (a prefill chunk's attention reads the cache
dequantized into two scratch states; docs/quantization.md "KV cache")."""
from kernel_builder.kv_dequant import builder, external, reference
from kernel_builder.spec import KernelSig, KernelSpec

SPEC = KernelSpec(KernelSig("kv_dequant", ("kv", "k", "v"), writes=("k", "v")),
                  builder.build, reference.kv_dequant, (external.FAMILY,), external.COSTS)
