"""AWQ / GPTQ int4 safetensors (HF `quantization_config`, group 128) through the model path end to end: tiny
random checkpoints written in the layouts those configs describe (AutoAWQ GEMM packing; GPTQ v1, sym), run with
`--weights q4` on emu with the codes loaded exactly (no requantization: gemv_q4 / dequant_q4 at group 128), give
bit for bit the logits of the bf16 engine on the checkpoint holding the same dequantized weights, and follow
transformers on that dequantized checkpoint (the verify gate's rule, logits cosine >= 0.99)."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from checkpoints import write_numpy_checkpoint, write_safetensors

from llama_npu import quant
from llama_npu.errors import WeightsError

G = 128
SHAPE = dict(hidden=128, n_heads=4, n_kv_heads=2, ffn=256, n_layers=2, vocab=256, max_position=256)
LINEAR = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
          "mlp.up_proj", "mlp.down_proj")


def _words(codes, axis_order):
    """codes [rows, cols] 0..15 -> int32 [rows, cols/8]: nibble i of a word holds column axis_order[i] of 8."""
    out = np.zeros((codes.shape[0], codes.shape[1] // 8), np.uint32)
    for i, c in enumerate(axis_order):
        out |= codes[:, c::8].astype(np.uint32) << np.uint32(4 * i)
    return out.view(np.int32)


def _quantize(w, sym):
    """[out, in] -> codes [in, out] (0..15), zeros [in/G, out], f16 scales [in/G, out] (per group along `in`)."""
    wt = np.asarray(w, np.float32).T                                  # [in, out]
    g = wt.reshape(-1, G, wt.shape[1])
    if sym:
        s = (np.abs(g).max(axis=1) / 7).astype(np.float16)
        z = np.full(s.shape, 8)
    else:
        lo, hi = g.min(axis=1), g.max(axis=1)
        s = ((hi - lo) / 15).astype(np.float16)
        z = np.clip(np.rint(-lo / s.astype(np.float32)), 0, 15).astype(np.int64)
    q = np.clip(np.rint(g / s.astype(np.float32)[:, None]) + z[:, None], 0, 15).astype(np.int64)
    return q.reshape(wt.shape), z, s


def _write_quantized(src, dst, method):
    """The bf16 checkpoint `src` with every layer projection in `method`'s int4 tensors (f16 scales)."""
    from llama_npu.weights import Checkpoint
    shutil.copytree(src, dst)
    ck = Checkpoint(src)
    t = {n: np.array(ck.get(n)) for n in ck.refs}
    exact = {}
    for i in range(SHAPE["n_layers"]):
        for lin in LINEAR:
            p = f"model.layers.{i}.{lin}"
            q, z, s = _quantize(t.pop(f"{p}.weight"), sym=method == "gptq")
            exact[p] = ((q - np.repeat(z, G, axis=0)) * np.repeat(s.astype(np.float32), G, axis=0)).T
            if method == "awq":                  # qweight [in, out/8] in AutoAWQ's column order; qzeros alike
                t[f"{p}.qweight"], t[f"{p}.qzeros"] = _words(q, quant.AWQ_ORDER), _words(z, quant.AWQ_ORDER)
            else:                                # GPTQ v1: qweight packed along `in`, qzeros store z - 1
                t[f"{p}.qweight"] = _words(q.T, range(8)).T.copy()
                t[f"{p}.qzeros"] = _words((z - 1) & 0xF, range(8))
                t[f"{p}.g_idx"] = (np.arange(q.shape[0]) // G).astype(np.int32)
            t[f"{p}.scales"] = s
    write_safetensors(dst / "model.safetensors", t)
    cfg = json.loads((dst / "config.json").read_text())
    cfg["quantization_config"] = ({"quant_method": "awq", "bits": 4, "group_size": G, "zero_point": True,
                                   "version": "gemm"} if method == "awq" else
                                  {"quant_method": "gptq", "bits": 4, "group_size": G, "sym": True,
                                   "desc_act": False, "checkpoint_format": "gptq"})
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst, exact


def _dequantized(qdir, dst):
    """The bf16 checkpoint of the weights the q4 run uses (quant.quantized_layer's dequantization)."""
    from llama_npu.weights import Checkpoint
    shutil.copytree(qdir, dst)
    cfg = json.loads((dst / "config.json").read_text())
    qcfg = cfg.pop("quantization_config")
    (dst / "config.json").write_text(json.dumps(cfg))
    ck = Checkpoint(qdir)
    t = {n: np.array(ck.get(n)) for n in ck.refs if not n.endswith((".qweight", ".qzeros", ".scales", ".g_idx"))}
    for i in range(SHAPE["n_layers"]):
        for lin in LINEAR:
            p = f"model.layers.{i}.{lin}"
            t[f"{p}.weight"] = quant.quantized_layer(ck, p, qcfg).dequantize()
    write_safetensors(dst / "model.safetensors", t)
    return dst


@pytest.mark.parametrize("method", ["awq", "gptq"])
def test_int4_checkpoint_runs_natively_and_matches(tmp_path, method):
    from llama_npu.engine import Engine
    from llama_npu.models import model_for
    from llama_npu.config import load_config

    src = write_numpy_checkpoint(tmp_path / "m", seed=21, **SHAPE)
    qdir, exact = _write_quantized(src, tmp_path / method, method)
    ref = _dequantized(qdir, tmp_path / "deq")
    from llama_npu.weights import Checkpoint
    ck = Checkpoint(ref)
    for p, w in exact.items():       # the layout read as the config says: (q - z) * s up to the bf16 scale rounding
        got = np.asarray(ck.get(f"{p}.weight"), np.float32)
        assert np.abs(got - w).max() <= 2**-7 * np.abs(w).max(), p
    m = model_for(load_config(qdir), "q4")
    assert m.q4_group == G and m.decode(256).decls[0].launches[1].build.args[1:] == (128, 128, 128, 1)
    ids = [1, 5, 17, 42, 7, 99, 3]
    runs = {}
    for label, path, mode in (("q4", qdir, "q4"), ("deq", ref, "bf16")):
        eng = Engine.load(str(path), device="emu", buckets=(16,), cache_dir=tmp_path / "k", progress=False,
                          context=256, weights_mode=mode, warmup=False)
        logits = [eng.prefill(ids).logits]
        for _ in range(3):
            logits.append(np.asarray(eng.decode_step(int(np.argmax(logits[-1])))))
        runs[label] = logits
    for a, b in zip(runs["q4"], runs["deq"]):
        np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32))
    from test_engine_hf import cosine, gate, hf_greedy
    hf = hf_greedy(ref, ids, 4)
    assert gate(runs["q4"], hf) >= 2
    for a, b in zip(runs["q4"], hf):
        assert cosine(a, b) >= 0.99


def test_int4_checkpoint_needs_q4_and_a_known_config(tmp_path):
    from llama_npu.config import load_config
    from llama_npu.weights import ModelWeights
    src = write_numpy_checkpoint(tmp_path / "m", seed=22, **SHAPE)
    qdir, _ = _write_quantized(src, tmp_path / "awq", "awq")
    with pytest.raises(WeightsError, match="is awq 4-bit; run it with --weights q4"):
        ModelWeights(load_config(qdir))
    for bad, msg in (({"quant_method": "awq", "bits": 8, "group_size": 128}, "bits=8"),
                     ({"quant_method": "bitsandbytes"}, "not supported"),
                     ({"quant_method": "awq", "bits": 4, "group_size": 128, "version": "gemv"}, "version")):
        with pytest.raises(WeightsError, match=msg):
            quant.checkpoint_quantization({"quantization_config": bad})


def test_gguf_q8_vocabulary_runs_in_8_bits_one_copy(tmp_path):
    """A GGUF with Q4_1 layers and a Q8_0 tied token embedding (the embedded SmolLM2 GGUF's make-up): the LM head's
    GEMVs run on the 8-bit rows (gemv_q4 at bits 8, `lm_<p>_q8` windows of the `vocab` state), the embedding rows are gathered from that
    same copy, and the logits equal the bf16 engine's on the dequantized checkpoint bit for bit."""
    gguf = pytest.importorskip("gguf")
    from llama_npu.embedded import GGUF_SOURCE
    from llama_npu.models.graph import HEAD_PLAN
    from llama_npu.engine import Engine
    from llama_npu.weights import Checkpoint, DequantRows

    src = write_numpy_checkpoint(tmp_path / "m", seed=23, **SHAPE)
    ck = Checkpoint(src)
    tensors = {n: np.array(ck.get(n)) for n in ck.refs}
    n_blocks = SHAPE["n_layers"]
    tmap = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, n_blocks)
    path = tmp_path / "m.gguf"
    wr = gguf.GGUFWriter(str(path), "llama")
    quantized = [n for n, a in tensors.items() if a.ndim == 2]
    for n in quantized:
        qt = gguf.GGMLQuantizationType.Q8_0 if n == "model.embed_tokens.weight" else gguf.GGMLQuantizationType.Q4_1
        q = gguf.quants.quantize(tensors[n].astype(np.float32), qt)
        wr.add_tensor(tmap.get_name(n.removesuffix(".weight")) + ".weight", q, raw_shape=q.shape, raw_dtype=qt)
    wr.write_header_to_file()
    wr.write_kv_data_to_file()
    wr.write_tensors_to_file()
    wr.close()
    loaded = quant.gguf_tensors(path, quantized, SHAPE["n_heads"], SHAPE["n_kv_heads"], keep_q8=True)
    assert loaded["model.embed_tokens.weight"].bits == 8
    deq = tmp_path / "deq"
    shutil.copytree(src, deq)
    write_safetensors(deq / "model.safetensors", {**tensors, **{n: t.dequantize() for n, t in loaded.items()}})
    qdir = tmp_path / "q"
    shutil.copytree(deq, qdir)
    (qdir / GGUF_SOURCE).write_text(str(path) + "\n")
    ids = [1, 5, 17, 42, 7]
    runs = {}
    for label, p, mode in (("q4", qdir, "q4"), ("deq", deq, "bf16")):
        eng = Engine.load(str(p), device="emu", buckets=(16,), cache_dir=tmp_path / "k", progress=False,
                          context=256, weights_mode=mode, warmup=False)
        logits = [eng.prefill(ids).logits]
        for _ in range(3):
            logits.append(np.asarray(eng.decode_step(int(np.argmax(logits[-1])))))
        runs[label] = logits
        if mode == "q4":
            head = eng.plans[HEAD_PLAN].steps[0].decl
            vocab = {a.name: a.dtype for a in head.args if getattr(a, "state_name", None) == "vocab"}
            # the LM head's partitions are windows of the one 8-bit `vocab` state (the embedding rows read it too)
            assert vocab and set(vocab.values()) == {"i8"} and all(n.endswith("_q8") for n in vocab), vocab
            assert not any(a.name.startswith("lm_") and a.dtype == "bf16" for a in head.args)
            assert {la.build.args[-1] for la in head.launches if la.build.args[0] == "gemv_q4"} == {8}
            assert isinstance(eng.weights.embed(), DequantRows)          # one copy of the tied matrix
    for a, b in zip(runs["q4"], runs["deq"]):
        np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32))


def test_int4_checkpoint_memory_plan(tmp_path):
    """The memory plan of an AWQ checkpoint counts group-128 rows for the layers and a bf16 LM head."""
    from kernel_builder.gemv_q4.format import Q4Layout
    from llama_npu.config import load_config
    from llama_npu.memory import plan_memory
    src = write_numpy_checkpoint(tmp_path / "m", seed=24, **SHAPE)
    qdir, _ = _write_quantized(src, tmp_path / "awq", "awq")
    rtn = plan_memory(load_config(src), (16,), 256, weights="q4")
    awq = plan_memory(load_config(qdir), (16,), 256, weights="q4")
    vocab, h, ffn = SHAPE["vocab"], SHAPE["hidden"], SHAPE["ffn"]
    down = h * (Q4Layout(ffn, 32, True).row_bytes - Q4Layout(ffn, G, True).row_bytes)   # the only row that shrinks
    head = 2 * vocab * h - vocab * Q4Layout(h, 32, True).row_bytes                     # bf16 instead of q4 rows
    assert awq.weights_bytes == rtn.weights_bytes - SHAPE["n_layers"] * down + head
