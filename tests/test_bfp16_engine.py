"""`--weights bfp16` end to end: every linear layer at rest in block float (kernel_builder/block_float.py), rounded
once at load; prefill GEMMs are gemm_bfp, decode GEMVs gemv_bfp(_bias); the LM head stays bf16.

Against the bf16 engine on a checkpoint holding the rounded weights: the prefill GEMMs' inputs are block float too
(the RMSNorm and the SwiGLU epilogue write them so, as the NPU's in-core conversion of a bf16 A rounds them: docs/
block-float.md "Activations"), and decode rounds each GEMV's input vector to block float (the matrix unit's A
operand), so both stay within a stated tolerance of that engine's logits (7-8 significant bits per group of 8 on
every linear layer's input)."""
from __future__ import annotations

import numpy as np
import pytest
from checkpoints import block_float_copy, write_numpy_checkpoint


def test_bfp16_engine_against_bf16_engine_on_rounded_weights(tmp_path):
    from llama_npu.engine import Engine
    src = write_numpy_checkpoint(tmp_path / "m", hidden=128, n_heads=4, n_kv_heads=2, ffn=256, n_layers=2,
                                 vocab=256, max_position=256)
    block_float_copy(src, tmp_path / "r")
    runs = {}
    for label, path, mode in (("bfp", src, "bfp16"), ("ref", tmp_path / "r", "bf16")):
        eng = Engine.load(str(path), device="emu", buckets=(64,), cache_dir=tmp_path / "k", progress=False,
                          context=256, weights_mode=mode, warmup=False)
        logits = [np.asarray(eng.prefill([5, 17, 42, 7]).logits, np.float32)]
        for t in (3, 99, 12):             # the same tokens for both: the decode inputs do not diverge
            logits.append(np.asarray(eng.decode_step(t), np.float32))
        runs[label] = logits
    for a, b in zip(runs["bfp"], runs["ref"]):
        # each GEMM / GEMV input rounded to 7-8 significant bits per group of 8 (numerics of gemm_bfp, gemv_bfp)
        assert np.abs(a - b).max() <= 0.05 * np.abs(b).max() + 1e-3, np.abs(a - b).max()
        assert np.corrcoef(a, b)[0, 1] > 0.999


def test_bfp16_modules_read_block_float_statics_and_fit():
    from kernel_builder.hw import analyze_module
    from llama_npu.models.llama import LLAMA32_1B, LlamaModel
    from multi_launch_builder.stitcher import stitch
    m = LlamaModel(LLAMA32_1B, "bfp16")
    d = m.decode(1024).decls[0]
    statics = {a.name: (a.shape, a.dtype) for a in d.args if a.role.name == "STATIC"}
    assert statics["w_gate_up_bfp"] == ((2048, 18432), "i8") and statics["wq_bfp"] == ((256, 18432), "i8")
    assert not {"wq", "w_gate_up", "w_down"} & set(statics)
    kinds = [la.build.args[0] for la in d.launches if la.build.args[0].startswith("gemv")]
    assert kinds == ["gemv_bfp"] * 3 + ["gemv_bfp_bias", "gemv_bfp", "gemv_bfp_bias"], kinds
    rep = analyze_module(stitch(d), d.name)
    assert rep.ok, rep.first_violation()
    ffn = next(x for x in m.prefill(256).decls if x.name.startswith("ffn_"))
    assert [la.build.args[:1] + la.build.args[4:] for la in ffn.launches if la.build.args[0].startswith("gemm")] \
        == [("gemm_bfp",), ("gemm_bfp", "swiglu"), ("gemm_bfp",)]
    rep = analyze_module(stitch(ffn), ffn.name)
    assert rep.ok, rep.first_violation()
    head = m.head().decls[0]
    assert all(a.dtype == "bf16" for a in head.args if a.name.startswith("lm_"))   # the LM head stays bf16


def test_bfp16_weights_take_9_of_16_bytes():
    from llama_npu.memory import plan_memory
    from llama_npu.models.llama import LLAMA32_1B
    bf = plan_memory(LLAMA32_1B, (256,), 2048, weights="bf16")
    bfp = plan_memory(LLAMA32_1B, (256,), 2048, weights="bfp16")
    assert bfp.embed_bytes == bf.embed_bytes > 0                              # the bf16 LM head, as before
    norms = (2 * LLAMA32_1B.n_layers + 1) * LLAMA32_1B.hidden * 2             # RMSNorm weights stay bf16
    layers_bf, layers_bfp = bf.weights_bytes - bf.embed_bytes - norms, bfp.weights_bytes - bfp.embed_bytes - norms
    assert layers_bfp == pytest.approx(layers_bf * 9 / 16, rel=1e-6)


def test_bfp16_rejects_the_fused_gemm_bias():
    from llama_npu.models.graph import Op, Phase, Weight
    from llama_npu.models.lowering import linear_bias
    with pytest.raises(ValueError, match="no block-float form"):
        linear_bias(Op("linear_bias", ("x", Weight("wq"), Weight("bq")), "q", 64),
                    Phase("prefill", 256, 0), type("G", (), {"weights": "bfp16", "width": lambda self, t: 64})())
