"""`--weights q4` end to end on emu: a tiny random checkpoint run with 4-bit decode GEMVs and a 4-bit tied LM head
(quantized at load, RTN group 32; the embedding rows gathered from that one copy) gives exactly the logits of the bf16 engine on the checkpoint holding the dequantized weights
(the host 4-bit GEMV computes the bf16 GEMV's bits on the dequantized weights; prefill reads those weights),
and the decode module lowers to gemv_q4 on `<w>_q4` statics that pass the hardware model."""
from __future__ import annotations

import numpy as np
import pytest
from checkpoints import write_numpy_checkpoint, write_safetensors

from kernel_builder.gemv_q4.format import dequantize, quantize_rtn


def _dequantized_copy(src, dst):
    import shutil

    from llama_npu.weights import Checkpoint
    shutil.copytree(src, dst)
    ck = Checkpoint(src)
    t = {}
    for n in ck.refs:
        a = np.array(ck.get(n))
        if a.ndim == 2:                     # every layer weight and the tied embedding / LM head
            a = dequantize(quantize_rtn(a, 32), a.shape[1], 32, True)
        t[n] = a
    write_safetensors(dst / "model.safetensors", t)


def test_q4_engine_equals_bf16_engine_on_dequantized_weights(tmp_path):
    from llama_npu.engine import Engine
    src = write_numpy_checkpoint(tmp_path / "m", hidden=128, n_heads=4, n_kv_heads=2, ffn=256, n_layers=2,
                                 vocab=256, max_position=256)
    _dequantized_copy(src, tmp_path / "deq")
    runs = {}
    for label, path, mode in (("q4", src, "q4"), ("deq", tmp_path / "deq", "bf16")):
        eng = Engine.load(str(path), device="emu", buckets=(64,), cache_dir=tmp_path / "k", progress=False,
                          context=256, weights_mode=mode, warmup=False)
        logits = [eng.prefill([5, 17, 42, 7]).logits]
        for _ in range(3):
            logits.append(np.asarray(eng.decode_step(int(np.argmax(logits[-1])))))
        runs[label] = logits
    for a, b in zip(runs["q4"], runs["deq"]):
        np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32))


def test_q4_decode_module_uses_gemv_q4_and_fits():
    from kernel_builder.hw import analyze_module
    from llama_npu.models.llama import LLAMA32_1B, LlamaModel
    from multi_launch_builder.stitcher import stitch
    d = LlamaModel(LLAMA32_1B, "q4").decode(1024).decls[0]
    statics = {a.name: (a.shape, a.dtype) for a in d.args if a.role.name == "STATIC"}
    assert statics["w_gate_q4"] == ((8192, 1280), "i8") and "w_gate" not in statics
    text = stitch(d)
    assert text.count("mvq4_bf16_k2048_g32_z1") >= 6
    rep = analyze_module(text, d.name)
    assert rep.ok, rep.first_violation()
    head = LlamaModel(LLAMA32_1B, "q4").head().decls[0]
    assert {a.name: (a.role.name, a.dtype, a.state) for a in head.args}["lm_0_q4"] == ("STATE", "i8", "vocab")
    assert analyze_module(stitch(head), head.name).ok
    with pytest.raises(ValueError, match="weights must be one of"):
        LlamaModel(LLAMA32_1B, "q3")
