"""Block-float activations of the `--weights bfp16` prefill (llama_npu/models/lowering.py activation_formats): an
activation is kept in block float (i8 [rows/8, 9*width], the weights' format) exactly when its producer can write
it so (rmsnorm, the gate/up GEMM's SwiGLU epilogue) and every reader is a GEMM taking it as its A operand; never in
decode, with other weights, for the layer output or a tensor another kind of op reads."""
from __future__ import annotations

import pytest


def _prefill(model, rows=256):
    return {d.name.split("_s")[0]: d for d in model.prefill(rows).decls}


def _formats(decl) -> dict:
    """{activation: dtype} of a module's activations, and {launch output: format keywords} of its kernels."""
    acts = {a.name: (a.shape, a.dtype) for a in decl.args if a.role.name in ("INPUT", "INTERMEDIATE", "OUTPUT")}
    kws = {la.prefix: dict(la.build.keywords) for la in decl.launches}
    return acts, kws


def test_llama_bfp16_prefill_keeps_the_gemm_inputs_in_block_float():
    from llama_npu.models.llama import LLAMA32_1B, LlamaModel
    mods = _prefill(LlamaModel(LLAMA32_1B, "bfp16"), 256)
    acts, kws = _formats(mods["qkv"])
    assert acts["h"] == ((32, 9 * 2048), "i8")                       # rmsnorm -> q, k, v GEMMs
    assert acts["x"] == ((256, 2048), "bf16") and acts["q_roped"][1] == "bf16"
    assert kws["h"] == {"out": "bfp16"} and kws["q"] == {"a": "bfp16"} and kws["k"] == {"a": "bfp16"}
    acts, kws = _formats(mods["ffn"])
    assert acts["h2"] == ((32, 9 * 2048), "i8") and acts["act"] == ((32, 9 * 8192), "i8")
    assert kws["act"] == {"a": "bfp16", "c": "bfp16"} and kws["down"] == {"a": "bfp16"}
    assert kws["proj"] == {} and acts["attn"][1] == "bf16"         # attention writes bf16: the O GEMM reads it
    assert acts["x_out"] == ((256, 2048), "bf16")                    # the layer output stays bf16


@pytest.mark.parametrize("weights", ["bf16", "q4"])
def test_other_weights_and_decode_keep_bf16_activations(weights):
    from llama_npu.models.llama import LLAMA32_1B, LlamaModel
    for d in LlamaModel(LLAMA32_1B, weights).prefill(256).decls:
        assert all(a.dtype != "i8" for a in d.args if a.role.name != "STATIC"), d.name
    for d in LlamaModel(LLAMA32_1B, "bfp16").decode(512).decls:
        assert all(a.dtype != "i8" for a in d.args if a.role.name not in ("STATIC",)), d.name
        assert all(not la.build.keywords for la in d.launches if la.build.args[0] in ("rmsnorm", "gemv_bfp"))


def test_per_head_norms_and_other_readers_keep_bf16():
    """Qwen3's per-head q/k RMSNorm (read by RoPE) and Qwen2's biased projections: only the layer norms' outputs
    (read by GEMMs alone) go to block float; a GEMM whose output a bias_add reads writes bf16."""
    from llama_npu.models.llama import LLAMA32_1B, QKNormLlama
    from llama_npu.models.qwen2 import QWEN25_1P5B, Qwen2Model
    acts, kws = _formats(_prefill(QKNormLlama(LLAMA32_1B, "bfp16"))["qkv"])
    assert [t for t, (_, dt) in acts.items() if dt == "i8"] == ["h"]
    acts, kws = _formats(_prefill(Qwen2Model(QWEN25_1P5B, "bfp16"))["qkv"])
    assert acts["h"][1] == "i8" and acts["q_nb"][1] == acts["q"][1] == "bf16"
    assert kws["q_nb"] == {"a": "bfp16"} and kws["q"] == {}     # the GEMM, then its bias_add launch


def test_gemma3_offset_norm_feeds_the_gemms_in_block_float():
    from llama_npu.models.gemma3 import GEMMA3_1B, GLOBAL, LOCAL, Gemma3Model
    m = Gemma3Model(GEMMA3_1B, (LOCAL, GLOBAL) * 13, 512, 256, weights="bfp16")
    decls = [d for d in m.prefill(256).decls if "qkv" in d.name]
    acts, kws = _formats(decls[0])
    assert acts["h"][1] == "i8" and kws["h"].get("out") == "bfp16"
