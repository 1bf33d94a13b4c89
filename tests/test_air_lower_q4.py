"""The 4-bit kernels and the q4 modules through the real lowering (mlir-air aircc's npu2 passes + the mlir-aie
aiecc passes up to the NPU instructions), when LLAMA_NPU_AIR_LOWER points to a real-lowering driver
(docs/verification.md, "Real lowering"); skipped otherwise. Each case also asks the hardware model, whose
verdict must agree: `dequant_q4` (the q4 prefill's per-layer weight) and `gemv_q4` (4-bit, group 32 / 128, and
8-bit codes) at Llama-3.2-1B / 3.1-8B shapes, the decode's fused `gemv_q4_swiglu` / `gemv_q4_bias` at 8B shapes, and the stitched Llama-3.2-1B q4 modules (prefill with the
dequantization into the scratch state, the fused decode layer, the LM head in 4 and 8 bits)."""
from __future__ import annotations

import os

import pytest

from kernel_builder.registry import kernel_text
from tooling import assert_lowers

LOWER = os.environ.get("LLAMA_NPU_AIR_LOWER", "")

pytestmark = pytest.mark.skipif(not LOWER, reason="LLAMA_NPU_AIR_LOWER not set (no mlir-air/mlir-aie lowering here)")

KERNELS = [
    ("dequant_q4", 2048, 2048, 32, 1), ("dequant_q4", 8192, 2048, 32, 1), ("dequant_q4", 2048, 8192, 32, 1),
    ("dequant_q4", 4096, 14336, 32, 1), ("dequant_q4", 14336, 4096, 128, 1),
    ("gemv_q4", 2048, 8192, 128, 1), ("gemv_q4", 16384, 2048, 32, 0, 8), ("gemv_q4", 6144, 576, 32, 0, 8),
    ("gemm_q4", 256, 2048, 2048, 32), ("gemm_q4", 64, 2048, 512, 32),
    # the 4-bit decode layer's fused launches at Llama-3.1-8B shapes (gate/up + SwiGLU, down + residual) and the
    # untied embedding row's dequantization (the 1B ones lower inside the token probe, check-lowering)
    ("gemv_q4_swiglu", 14336, 4096, 32, 1), ("gemv_q4_bias", 4096, 14336, 32, 1), ("dequant_q4", 1, 4096, 32, 1),
]


@pytest.mark.parametrize("case", KERNELS, ids=lambda c: "_".join(map(str, c)))
def test_q4_kernels_lower(tmp_path, case):
    kind, *args = case
    assert_lowers(LOWER, tmp_path, kind, kernel_text(kind, *args))


@pytest.mark.parametrize("name", ["qkv_s256", "ffn_s256", "layer_kv256", "lm_head", "lm_head_q8"])
def test_stitched_q4_modules_lower(tmp_path, name):
    from llama_npu.models.llama import LLAMA32_1B, LlamaModel
    from multi_launch_builder.stitcher import stitch
    m = LlamaModel(LLAMA32_1B, "q4")
    if name == "lm_head_q8":
        m.head_weights = "q8"
    decls = m.prefill(256).decls + m.decode(256).decls + m.head().decls
    (decl,) = [d for d in decls if d.name == name.removesuffix("_q8")]
    assert_lowers(LOWER, tmp_path, name, stitch(decl))

