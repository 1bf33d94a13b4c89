"""The families beside Llama (llama_npu/models/: qwen2.py, mistral.py, phi3.py, Qwen3 in llama.py) on random-weight
checkpoints at tiny shapes, against transformers (bf16, eager attention): prefill and 16 greedy decode steps on
emu (top-1 and top-5 by the verify gate's rule, logits cosine), per-layer hidden-state cosine of the prefill;
plus what each family's config reading refuses, before any weight is read."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest

from llama_npu.config import load_config
from llama_npu.errors import UnsupportedModel
from llama_npu.models import ARCHITECTURES
from llama_npu.models.graph import prefill_plan

from test_engine_hf import check_against_hf, cosine, load_engine, prompt_ids
from tooling import require_module

torch = require_module("torch")
require_module("transformers")

TINY = dict(hidden=256, n_heads=4, n_kv_heads=2, head_dim=64, ffn=512, n_layers=2, vocab=512)
DECODE = 16
WINDOW = 16   # Mistral / Phi-3 sliding window: prompts and decode run far past it
# Phi-4-mini-like longrope: original context 64, factors per rotary frequency (rotary dims 48 -> 24 factors)
PHI_ROT = 48
LONGROPE = {"rope_type": "longrope", "short_factor": [1.0 + 0.05 * i for i in range(PHI_ROT // 2)],
            "long_factor": [1.5 + 0.2 * i for i in range(PHI_ROT // 2)]}
CASES = {
    "qwen2-untied": dict(arch="qwen2", rope_theta=1000000.0, max_position=512, seed=11),
    "qwen2-tied": dict(arch="qwen2", rope_theta=1000000.0, max_position=512, seed=12, tie=True),
    "qwen3": dict(arch="qwen3", rope_theta=1000000.0, max_position=512, seed=13),
    "mistral": dict(arch="mistral", rope_theta=10000.0, max_position=1024, seed=14, sliding_window=WINDOW),
    "phi3": dict(arch="phi3", rope_theta=10000.0, max_position=256, seed=15, partial_rotary_factor=0.75,
                 rope_scaling=LONGROPE, original_max_position_embeddings=64, pad_token_id=0, sliding_window=WINDOW),
}
# prompt lengths: mistral 70 = a 64-row chunk, then a 16-row chunk at 54 whose attention reads the 64 cache rows
# [6, 70) (a sliding module); phi3 55 (short factors), decode crosses the original context of 64 (long factors).
# Both decode 17 steps past the window (the decode module reads the last WINDOW rows)
# (length, seed): seed 9 gives the mistral prompt no near-tie among the first greedy tokens
PROMPT = {"mistral": (70, 9), "phi3": (55, 4)}


def hf_hidden(model_dir, ids):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.bfloat16,
                                                 attn_implementation="eager").eval()
    with torch.no_grad():
        out = model(torch.tensor([ids]), output_hidden_states=True)
    # hidden_states[l + 1] is layer l's output; the last one is after the final norm in HF: compare the others
    return [h[0].float().numpy() for h in out.hidden_states[1:]]


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_family_matches_hf(hf_checkpoint, kernel_cache_dir, case):
    kw = CASES[case]
    model_dir = hf_checkpoint(**TINY, **kw)
    cfg = load_config(model_dir)
    assert ARCHITECTURES[cfg.family].model_type == kw["arch"]
    eng = load_engine(model_dir, (16, 64), kernel_cache_dir)
    n, seed = PROMPT.get(case, (13, len(case)))
    ids = prompt_ids(TINY["vocab"], n, seed=seed)
    matched = check_against_hf(model_dir, eng, ids, steps=DECODE + 1)
    assert matched >= 4, f"{case}: greedy sequences part after {matched} steps"
    ours = eng.prefill(ids, return_hidden=True).hidden
    ref = hf_hidden(model_dir, ids)
    for layer in range(TINY["n_layers"] - 1):
        for row in (0, len(ids) // 2, len(ids) - 1):
            c = cosine(ours[layer][row], ref[layer][row])
            assert c >= 0.99, f"{case}: layer {layer} row {row} hidden cosine {c:.4f}"


def test_qwen2_bias_is_in_the_graph_and_matters(hf_checkpoint, kernel_cache_dir):
    """The q/k/v biases are bias_add launches of the attention-input modules, and they matter: transformers with
    the biases zeroed is far from our logits (the random biases are large), so the comparison above could not
    pass without them."""
    from transformers import AutoModelForCausalLM

    model_dir = hf_checkpoint(**TINY, **CASES["qwen2-untied"])
    eng = load_engine(model_dir, (16, 64), kernel_cache_dir)
    qkv = eng.plans[prefill_plan(16, 16)].steps[0].decl
    assert [a.name for a in qkv.args if a.name in ("bq", "bk", "bv")] == ["bq", "bk", "bv"]
    assert sum(1 for la in qkv.launches if "bias_add" in la.build.args) == 3
    ids = prompt_ids(TINY["vocab"], 9)
    ours = eng.prefill(ids).logits
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.bfloat16,
                                                 attn_implementation="eager").eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("_proj.bias"):
                p.zero_()
        no_bias = model(torch.tensor([ids])).logits[0, -1].float().numpy()
    assert cosine(ours, no_bias) < 0.95


def test_mistral_window_is_attention_not_a_context_cap(hf_checkpoint):
    """The window no longer bounds the context; attention calls past it read only the rows their queries see:
    cache rows [kv0, kv0 + span) with kv0 = pos + rows - span, the position within them kv_pos."""
    from llama_npu.memory import choose_context
    from llama_npu.models import model_for
    from llama_npu.models.graph import KV0, KV_POS, call_scalars, decode_plan, prefill_plan

    model_dir = hf_checkpoint(**TINY, **CASES["mistral"])
    cfg = load_config(model_dir)
    assert (cfg.sliding_window, cfg.max_position) == (WINDOW, 1024)
    assert choose_context(cfg, (16, 64), 1024) == 1024
    plans = model_for(cfg).plans((16, 64), 1024)
    dec = plans[decode_plan(1024)].decls[0]
    assert dec.name == "layer_slide16" and {d.name for p in [plans[decode_plan(w)] for w in (256, 512)]
                                             for d in p.decls} == {"layer_slide16"}
    assert [a.shape[0] for a in dec.args if a.at == KV0] == [WINDOW, WINDOW]
    assert call_scalars(dec, 15) == {"pos": 15, KV0: 0, KV_POS: 15}
    assert call_scalars(dec, 500) == {"pos": 500, KV0: 485, KV_POS: 15}
    attn = plans[prefill_plan(16, 1024)].decls[1]
    assert attn.name == "attn_s16_slide64"         # 16 queries see 16 + 15 keys: one 64-row window
    assert call_scalars(attn, 54) == {KV0: 6, KV_POS: 48}
    assert plans[prefill_plan(64, 64)].decls[1].name == "attn_s64"   # a chunk at 0 in its own window


def _config(tmp_path, **over):
    base = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256,
            "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 512, "num_hidden_layers": 1,
            "vocab_size": 512, "max_position_embeddings": 256, "rms_norm_eps": 1e-5}
    base.update(over)
    (tmp_path / "config.json").write_text(json.dumps(base))
    return tmp_path


@pytest.mark.parametrize("over,msg", [
    ({"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2"}, "unsupported architecture GPT2LMHeadModel"),
    ({"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "use_sliding_window": True},
     "sliding-window attention layers are not supported for Qwen2ForCausalLM"),
    ({"architectures": ["Phi3ForCausalLM"], "model_type": "phi3", "partial_rotary_factor": 0.3},
     "partial_rotary_factor 0.3 gives 19 rotary dims"),
    ({"architectures": ["Phi3ForCausalLM"], "model_type": "phi3", "original_max_position_embeddings": 64,
      "rope_scaling": {"type": "longrope", "short_factor": [1.0] * 3, "long_factor": [1.0] * 3}},
     "longrope short_factor has 3 entries, rotary dims / 2 = 32"),
    ({"architectures": ["MistralForCausalLM"], "model_type": "mistral", "sliding_window": 0},
     "sliding_window must be a positive integer"),
])
def test_unsupported_configs_are_one_line(tmp_path, over, msg):
    with pytest.raises(UnsupportedModel) as e:
        load_config(_config(tmp_path, **over))
    text = str(e.value)
    assert msg in text and "\n" not in text
    if "unsupported architecture" in msg:
        for arch in ("LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM", "MistralForCausalLM",
                     "Phi3ForCausalLM"):
            assert arch in text


def test_partial_rotary_table_and_order():
    """The RoPE table of a partial-rotary head rotates rotary_dim/2 pairs and leaves the others exactly (cos 1,
    sin 0); rotary_order pairs HF's (i, i + rd/2) at the kernel's (j, j + hd/2)."""
    from kernel_builder.rope.reference import rope
    from llama_npu.models.llama import rotary_order
    from llama_npu.rope import rope_lut

    hd, rd = 64, 48
    order = rotary_order(hd, rd)
    assert sorted(order) == list(range(hd))
    assert all(order[j + hd // 2] == order[j] + rd // 2 for j in range(rd // 2))
    lut = rope_lut(np.arange(5), hd, 10000.0, None, rd)
    assert np.all(lut[:, rd // 2:hd // 2].astype(np.float32) == 1) and np.all(lut[:, hd // 2 + rd // 2:] == 0)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((5, hd)).astype(np.float32)
    # HF: rotate_half on x[:rd], pass x[rd:]; ours: permute, rotate half-split, un-permute
    full = rope_lut(np.arange(5), rd, 10000.0)
    c, s = full[:, :rd // 2].astype(np.float32), full[:, rd // 2:].astype(np.float32)
    x1, x2 = x[:, :rd // 2], x[:, rd // 2:rd]
    hf = np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s, x[:, rd:]], axis=1)
    ours = rope(x[:, order], lut, rows=5, heads=1, head_dim=hd).astype(np.float32)
    back = np.empty_like(ours)
    back[:, order] = ours
    np.testing.assert_allclose(back, hf, rtol=1e-2, atol=1e-2)


def test_phi4_mini_style_config_transformers4_keys(tmp_path):
    """Phi-4-mini's config.json keys as published (transformers-4 style: top-level partial_rotary_factor and
    original_max_position_embeddings, rope_scaling {"type": "longrope", ...}, sliding_window)."""
    import math

    rot = 48
    d = _config(tmp_path, architectures=["Phi3ForCausalLM"], model_type="phi3", hidden_size=3072,
                num_attention_heads=24, num_key_value_heads=8, intermediate_size=8192,
                max_position_embeddings=131072, original_max_position_embeddings=4096, partial_rotary_factor=0.75,
                sliding_window=262144, tie_word_embeddings=True, rope_theta=10000.0,
                rope_scaling={"type": "longrope", "short_factor": [1.0] * rot, "long_factor": [2.0] * rot})
    cfg = load_config(d)
    assert cfg.family == "Phi3ForCausalLM" and cfg.shapes.rotary_dim == 96 and cfg.max_position == 131072
    from llama_npu.models import model_for
    assert cfg.sliding_window == 262144 and model_for(cfg).sliding_window is None   # past the context: no window
    sc = cfg.rope.scaling
    assert sc["rope_type"] == "longrope" and sc["original_max_position_embeddings"] == 4096
    assert sc["attention_factor"] == pytest.approx(math.sqrt(1 + math.log(32) / math.log(4096)))
    raw = json.loads((d / "config.json").read_text())
    raw["rope_scaling"]["type"] = "su"          # Phi-3-mini-128k's early name for longrope
    (d / "config.json").write_text(json.dumps(raw))
    assert load_config(d).rope.scaling == sc


def test_q4_phi3_fused_and_partial_rotary_rows(hf_checkpoint, tmp_path):
    """`--weights q4` on Phi-3: the 4-bit rows of the fused qkv / gate_up tensors (RTN per row, group 32) are split
    and put in the partial-rotary order exactly as the bf16 rows are (a row permutation of whole packed rows), so
    the q4 engine gives bit for bit the logits of the bf16 engine on the RTN-dequantized checkpoint, and follows
    transformers on that checkpoint."""
    import shutil

    from checkpoints import write_safetensors
    from kernel_builder.gemv_q4.format import dequantize, quantize_rtn
    from llama_npu.engine import Engine
    from llama_npu.weights import Checkpoint
    from test_engine_hf import gate, hf_greedy

    src = hf_checkpoint(**TINY, **CASES["phi3"])
    deq = tmp_path / "deq"
    shutil.copytree(src, deq)
    ck = Checkpoint(src)
    t = {}
    for n in ck.refs:
        a = np.array(ck.get(n))
        if a.ndim == 2:   # layers + the LM head + the embedding (an untied one is q4 rows too in a q4 run)
            a = dequantize(quantize_rtn(a, 32), a.shape[1], 32, True)
        t[n] = a
    (deq / "model.safetensors").unlink()
    write_safetensors(deq / "model.safetensors", t)
    ids = prompt_ids(TINY["vocab"], 13, seed=4)
    runs = {}
    for label, path, mode in (("q4", src, "q4"), ("deq", deq, "bf16")):
        eng = Engine.load(str(path), device="emu", buckets=(16,), cache_dir=tmp_path / "k", progress=False,
                          context=256, weights_mode=mode, warmup=False)
        logits = [eng.prefill(ids).logits]
        for _ in range(4):
            logits.append(np.asarray(eng.decode_step(int(np.argmax(logits[-1])))))
        runs[label] = logits
    for a, b in zip(runs["q4"], runs["deq"]):
        np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32))
    hf = hf_greedy(deq, ids, 5)
    assert gate(runs["q4"], hf) >= 3
    assert all(cosine(a, b) >= 0.99 for a, b in zip(runs["q4"], hf))


def test_sliding_modules_equal_the_whole_window(tmp_path, monkeypatch):
    """A window of 300 keys (span 320 rows): prefill chunks and decode steps from the plain modules (KV window
    from row 0, the window only masked) to the sliding one (`layer_slide320`: rows [kv0, kv0 + 320), kv0 = 0
    until position 319, then sliding) give the logits of the same model reading the whole window from row 0,
    bit for bit: a windowed call's reads leave its result unchanged (checked to fail with kv_pos one off, or kv0
    past the 20 rows of slack the span has over the window)."""
    from checkpoints import write_numpy_checkpoint
    from llama_npu.engine import Engine
    from llama_npu.models.llama import LlamaModel

    src = write_numpy_checkpoint(tmp_path / "m", hidden=128, n_heads=4, n_kv_heads=2, ffn=256, n_layers=2,
                                 vocab=256, max_position=1024,
                                 config_overrides={"architectures": ["MistralForCausalLM"], "model_type": "mistral",
                                                   "sliding_window": 300})
    ids = prompt_ids(256, 250, seed=3)
    runs = {}
    for label in ("slide", "whole"):
        if label == "whole":
            monkeypatch.setattr(LlamaModel, "slide_rows", lambda self, rows, kv_rows, variant="": 0)
        eng = Engine.load(str(src), device="emu", buckets=(64,), cache_dir=tmp_path / "k", progress=False,
                          context=1024, warmup=False)
        names = {d.name for p in eng.plans.values() for d in p.decls}
        assert ("layer_slide320" in names) == (label == "slide")
        logits = [eng.prefill(ids).logits]
        while eng.pos < 330:                # decode crosses 256 (plain -> sliding module) and 320 (kv0 > 0)
            logits.append(np.asarray(eng.decode_step(int(np.argmax(logits[-1])))))
        runs[label] = logits
    for a, b in zip(runs["slide"], runs["whole"]):
        np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32))
