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
    # q, k, v: gemv_q4; o_proj + residual: gemv_q4_bias; gate/up + SwiGLU: gemv_q4_swiglu; down + residual
    assert [la.build.args[0] for la in d.launches if la.build.args[0].startswith("gemv")] == \
        ["gemv_q4"] * 3 + ["gemv_q4_bias", "gemv_q4_swiglu", "gemv_q4_bias"]
    assert text.count("mvq4_bf16_k2048_g32_z1") >= 4 and "mvq4s_bf16_k2048_g32_z1" in text \
        and "mvq4b_bf16_k8192_g32_z1" in text
    rep = analyze_module(text, d.name)
    assert rep.ok, rep.first_violation()
    head = LlamaModel(LLAMA32_1B, "q4").head().decls[0]
    assert {a.name: (a.role.name, a.dtype, a.state) for a in head.args}["lm_0_q4"] == ("STATE", "i8", "vocab")
    assert analyze_module(stitch(head), head.name).ok
    with pytest.raises(ValueError, match="weights must be one of"):
        LlamaModel(LLAMA32_1B, "q3")


def test_q4_prefill_dequantizes_into_the_shared_scratch_and_fits():
    """Where the counted model prefers it (Llama-3.2-1B at 2048 rows), prefill GEMMs read a window of the scratch
    state of their k, written by the weight's dequant_q4 launch just before; in 256-row chunks the projections are
    gemm_q4 launches on the q4 rows (no scratch window), the down projection keeps the scratch. The modules' statics
    are the q4 rows only (no bf16 copy), and they pass the hardware model."""
    from kernel_builder.hw import analyze_module
    from llama_npu.models.llama import LLAMA32_1B, LlamaModel
    from llama_npu.models.lowering import scratch_states
    from multi_launch_builder.stitcher import stitch
    m = LlamaModel(LLAMA32_1B, "q4")
    ffn = next(d for d in m.prefill(2048).decls if d.name.startswith("ffn_"))
    roles = {a.name: (a.role.name, a.shape, a.dtype, a.state) for a in ffn.args}
    assert roles["w_gate_q4"] == ("STATIC", (8192, 1280), "i8", "")
    assert roles["w_down_deq"] == ("STATE", (2048, 8192), "bf16", "wdeq_k8192")
    assert not [n for n, r in roles.items() if r[0] == "STATIC" and r[2] == "bf16" and len(r[1]) == 2]
    kinds = [la.build.args[0] for la in ffn.launches]
    assert kinds[kinds.index("dequant_q4") + 1] == "gemm"
    assert [la.wiring for la in ffn.launches if la.prefix.startswith("gate")] == [("w_gate_q4", "w_gate_deq"),
                                                                                  ("h2", "w_gate_deq", "gate")]
    decls = m.prefill(256).decls
    ffn = next(d for d in decls if d.name.startswith("ffn_"))
    assert [la.wiring for la in ffn.launches if la.prefix.startswith("gate")] == [("h2", "w_gate_q4", "gate")]
    assert [la.build.args[0] for la in ffn.launches].count("gemm_q4") == 3     # o, gate, up; down: the scratch
    assert scratch_states(m.modules((64, 256), 1024)) == {"wdeq_k8192": 2048}
    assert scratch_states(m.modules((64, 256, 2048), 1024)) == {"wdeq_k2048": 8192, "wdeq_k8192": 2048}
    for d in decls:
        rep = analyze_module(stitch(d), d.name)
        assert rep.ok, rep.first_violation()


def test_q4_device_buffers_are_below_bf16():
    """The memory plan (the bytes the ModuleExecutor allocates: tests/test_memory_plan.py) of a q4 run is below
    bf16's for Llama-3.2-1B and 3.1-8B shapes; the 8B's weights + scratch + 8k KV cache fit 6 GiB."""
    from llama_npu.memory import plan_memory
    from llama_npu.models.llama import LLAMA31_8B, LLAMA32_1B
    GiB = 2**30
    for sh, bf16_w in ((LLAMA32_1B, 2.3), (LLAMA31_8B, 14.0)):
        b = plan_memory(sh, (64, 256, 1024, 2048), 8192)
        q = plan_memory(sh, (64, 256, 1024, 2048), 8192, weights="q4")
        assert b.weights_bytes / GiB > bf16_w and b.scratch_bytes == 0
        # (bf16's prefill modules hold no gate / up intermediates since SwiGLU is fused into the gate/up GEMM,
        # so its activations are below q4's: 0.5 of the total before the fusion)
        assert q.weights_bytes < 0.32 * b.weights_bytes and q.total < 0.55 * b.total
        assert q.scratch_bytes == 2 * 2 * sh.ffn * sh.hidden         # [ffn, hidden] and [hidden, ffn], bf16
    q8 = plan_memory(LLAMA31_8B, (64, 256, 1024, 2048), 8192, weights="q4")
    assert q8.weights_bytes + q8.scratch_bytes + q8.kv_cache_bytes <= 6 * GiB


def test_q4_plan_matches_the_null_device(tmp_path):
    from llama_npu.config import load_config
    from llama_npu.engine import Engine
    from llama_npu.memory import plan_memory
    src = write_numpy_checkpoint(tmp_path / "m", hidden=128, n_heads=4, n_kv_heads=2, ffn=256, n_layers=2,
                                 vocab=256, max_position=256)
    eng = Engine.load(str(src), device="null", buckets=(16,), cache_dir=tmp_path / "k", progress=False,
                      context=256, weights_mode="q4")
    eng.prefill(list(range(3, 13)))
    eng.decode_step(5)
    report = eng.cache.memory_report()
    plan = plan_memory(load_config(src), (16,), eng.kv_capacity, weights="q4")
    assert report["cache_allocated_bytes"] == plan.total
    assert report["state_bytes"] == plan.kv_cache_bytes + plan.scratch_bytes + plan.embed_bytes > plan.kv_cache_bytes
