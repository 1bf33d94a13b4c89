"""The KV8 cache kernels through the real lowering (mlir-air aircc's npu2 passes + the mlir-aie aiecc passes up to
the NPU instructions), when LLAMA_NPU_AIR_LOWER points to a real-lowering driver (docs/verification.md, "Real
lowering"); skipped otherwise. Each case also asks the hardware model, whose verdict must agree: the writer
`kv_quant` (a decode row, a prefill chunk), the prefill's `kv_dequant` (a 1k window) and the decode attention `attention_kv8` at Llama-3.2-1B / SmolLM2
shapes (1k and 32k windows) and Llama-3.1-8B's (8k)."""
from __future__ import annotations

import os

import pytest

from kernel_builder.registry import kernel_text
from tooling import assert_lowers

LOWER = os.environ.get("LLAMA_NPU_AIR_LOWER", "")

pytestmark = pytest.mark.skipif(not LOWER, reason="LLAMA_NPU_AIR_LOWER not set (no mlir-air/mlir-aie lowering here)")

KERNELS = [
    ("kv_quant", 1, 8, 64, 0), ("kv_quant", 512, 8, 64, 1), ("kv_quant", 1, 3, 64, 1),
    ("kv_dequant", 1024, 8, 64), ("attention_kv8", 1, 1024, 32, 8, 64), ("attention_kv8", 1, 32768, 32, 8, 64), ("attention_kv8", 1, 256, 9, 3, 64),
    ("attention_kv8", 1, 8192, 32, 8, 128),
]


@pytest.mark.parametrize("case", KERNELS, ids=lambda c: "_".join(map(str, c)))
def test_kv8_kernels_lower(tmp_path, case):
    kind, *args = case
    assert_lowers(LOWER, tmp_path, kind, kernel_text(kind, *args))
