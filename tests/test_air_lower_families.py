"""One stitched module per new family at real widths through the real lowering (docs/verification.md, "Real
lowering"), each the module the family changed: Qwen2.5-1.5B's fused decode layer (q/k/v GEMVs with the bias
epilogue, `gemv_bias`), Mistral-7B's sliding-window decode layer (window 4096: its KV window is the 4096 cache rows
its query sees), Phi-4-mini's decode layer (partial rotary, fused tensors split at load: Llama's modules at its
widths) and Gemma-3-1B's local decode layer (window 512, head_dim 256, the (1 + w) norms and GeGLU). Runs when
LLAMA_NPU_AIR_LOWER points to a lowering driver; the hardware model must accept each module too."""
from __future__ import annotations

import dataclasses
import os

import pytest

from kernel_builder.hw import analyze_module
from multi_launch_builder.compile.lowering import lower_with_tool
from multi_launch_builder.stitcher import stitch
from llama_npu.models import FAMILY_SHAPES, FAMILIES
from llama_npu.models.gemma3 import GEMMA3_1B, GLOBAL, LOCAL, Gemma3Model

LOWER = os.environ.get("LLAMA_NPU_AIR_LOWER", "")
pytestmark = pytest.mark.skipif(not LOWER, reason="LLAMA_NPU_AIR_LOWER not set (no real lowering tool)")


def _family(name: str, **kw):
    arch, shapes = FAMILY_SHAPES[name]
    return FAMILIES[arch](dataclasses.replace(shapes, n_layers=2), **kw)


def _decl(family: str):
    if family == "qwen2.5-1.5b":
        return _family(family).decode(256).decls[0]                       # layer_kv256: 3 x gemv_bias
    if family == "mistral-7b":
        return _family(family, sliding_window=4096).decode(8192).decls[0]   # layer_slide4096
    if family == "phi-4-mini":
        return _family(family).decode(256).decls[0]                       # layer_kv256
    m = Gemma3Model(dataclasses.replace(GEMMA3_1B, n_layers=2, vocab=512), (LOCAL, GLOBAL), 512, 256)
    return m.decode(8192, LOCAL).decls[0]                                 # layer_slide512_local


FAMILIES_LOWERED = ["qwen2.5-1.5b", "mistral-7b", "phi-4-mini", "gemma-3-1b"]


@pytest.mark.parametrize("family", FAMILIES_LOWERED)
def test_family_module_lowers(tmp_path, family):
    decl = _decl(family)
    assert decl.name in ("layer_kv256", "layer_slide4096", "layer_slide512_local")
    text = stitch(decl)
    rep = analyze_module(text, decl.name)
    assert rep.ok, rep.first_violation()
    src = tmp_path / f"{decl.name}.mlir"
    src.write_text(text)
    res = lower_with_tool(LOWER, src, tmp_path / "out", timeout=3600)
    assert res.ok, f"{family} {decl.name}: {res.stage}: {res.message}"
