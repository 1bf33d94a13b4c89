"""Every stitched module of SmolLM2-135M and Llama-3.2-1B through the real lowering (mlir-air aircc's npu2 passes
+ the mlir-aie aiecc passes up to the NPU instructions), each with the aircc preset its header records.

Runs when LLAMA_NPU_AIR_LOWER points to a real-lowering driver (docs/verification.md, "Real lowering": `air-lower.sh
--whole -q MODULE.mlir OUTDIR`, last line `OK ...` or `FAIL <stage>/<pass>: ...`) AND LLAMA_NPU_AIR_LOWER_ALL=1:
the whole set is ~90 modules of 10 s to a few minutes each on 2 cores, too long to run by accident. The modules
are those `llama-npu compile` builds at the default buckets for an 8192-token context (every KV window's
attention chunk and fused decode layer), plus the host-attention decode fallback. The hardware model's verdict
must agree with the lowering for each (it passes all of them: tests/test_hw_modules.py)."""
from __future__ import annotations

import os

import pytest

from kernel_builder.hw import analyze_module
from multi_launch_builder.compile.lowering import lower_with_tool
from multi_launch_builder.stitcher import stitch
from llama_npu.models import llama as shapes
from llama_npu.models.llama import LlamaModel

LOWER = os.environ.get("LLAMA_NPU_AIR_LOWER", "")
pytestmark = pytest.mark.skipif(not (LOWER and os.environ.get("LLAMA_NPU_AIR_LOWER_ALL") == "1"),
                                reason="LLAMA_NPU_AIR_LOWER and LLAMA_NPU_AIR_LOWER_ALL=1 not both set")

MODELS = {"smollm2-135m": shapes.SMOLLM2_135M, "llama32-1b": shapes.LLAMA32_1B}
BUCKETS = (64, 256, 1024, 2048)   # llama_npu.config.DEFAULT_BUCKETS
CONTEXT = 8192


def _decls(model: str):
    m = LlamaModel(MODELS[model])
    return m.modules(BUCKETS, CONTEXT) + [d for d in m.modules(BUCKETS, CONTEXT, "host") if d.name.endswith("_dec")]


CASES = [(model, d.name) for model in MODELS for d in _decls(model)]


@pytest.mark.parametrize("model,name", CASES, ids=[f"{m}-{n}" for m, n in CASES])
def test_stitched_module_lowers(tmp_path, model, name):
    (decl,) = [d for d in _decls(model) if d.name == name]
    text = stitch(decl)
    src = tmp_path / f"{name}.mlir"
    src.write_text(text)
    res = lower_with_tool(LOWER, src, tmp_path / "out", timeout=3600)
    assert res.ok, f"{model} {name}: {res.stage}: {res.message}"
    rep = analyze_module(text, name)
    assert rep.ok, rep.first_violation()
