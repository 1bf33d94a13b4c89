"""The `dequant_q4` kernel: 4-bit weights (gemv_q4/format.py) dequantized to bf16 rows on the device (the prefill
GEMMs' weight, one layer at a time into a shared scratch: docs/quantization.md, "Prefill")."""
from kernel_builder.dequant_q4 import builder, external, reference
from kernel_builder.spec import KernelSig, KernelSpec

SPEC = KernelSpec(KernelSig("dequant_q4", ("w", "y")),
                  builder.build, reference.dequant_q4, (external.FAMILY,), external.COSTS)
