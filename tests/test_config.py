import json

import pytest

from llama_npu.config import load_config, parse_config
from llama_npu.errors import UnsupportedModel

BASE = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 2048,
        "num_attention_heads": 32, "num_key_value_heads": 8, "num_hidden_layers": 16,
        "intermediate_size": 8192, "vocab_size": 128256, "max_position_embeddings": 131072,
        "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "hidden_act": "silu", "tie_word_embeddings": True,
        "attention_bias": False, "mlp_bias": False, "eos_token_id": [128001, 128008, 128009]}
LLAMA3 = {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 8192}


def write(tmp_path, cfg, gen=None):
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    if gen is not None:
        (tmp_path / "generation_config.json").write_text(json.dumps(gen))
    return tmp_path


def test_llama32_1b_config(tmp_path):
    cfg = load_config(write(tmp_path, {**BASE, "rope_scaling": LLAMA3}, {"eos_token_id": 128001, "bos_token_id": 128000}))
    s = cfg.shapes
    assert (s.hidden, s.n_heads, s.n_kv_heads, s.head_dim, s.ffn, s.vocab, s.n_layers) == \
        (2048, 32, 8, 64, 8192, 128256, 16)
    assert s.rms_eps == 1e-5
    assert cfg.rope.theta == 500000.0
    assert cfg.rope.scaling == LLAMA3
    assert cfg.tie_embeddings and cfg.max_position == 131072
    assert cfg.eos_ids == (128001, 128008, 128009) and cfg.bos_id == 128000


def test_transformers5_rope_parameters_and_explicit_head_dim(tmp_path):
    raw = {k: v for k, v in BASE.items() if k != "rope_theta"}
    raw.update(hidden_size=3072, num_attention_heads=24, head_dim=128,
               rope_parameters={**LLAMA3, "rope_theta": 250000.0})
    cfg = load_config(write(tmp_path, raw))
    assert cfg.shapes.head_dim == 128 and cfg.shapes.q_dim == 3072
    assert cfg.rope.theta == 250000.0 and cfg.rope.scaling["factor"] == 32.0


def test_default_rope_type_means_no_scaling(tmp_path):
    cfg = load_config(write(tmp_path, {**BASE, "rope_parameters": {"rope_type": "default", "rope_theta": 1e5}}))
    assert cfg.rope.scaling is None and cfg.rope.theta == 1e5


@pytest.mark.parametrize("change, needle", [
    ({"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2"}, "unsupported architecture GPT2LMHeadModel"),
    ({"architectures": ["Starcoder2ForCausalLM"], "model_type": "starcoder2"},
     "unsupported architecture Starcoder2ForCausalLM"),
    ({"architectures": ["Qwen2ForCausalLM"], "model_type": "llama"}, "unsupported architecture Qwen2ForCausalLM"),
    ({"attention_bias": True}, "attention_bias"),
    ({"mlp_bias": True}, "mlp_bias"),
    ({"hidden_act": "gelu"}, "hidden_act"),
    ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "unsupported rope_scaling type 'yarn'"),
    ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, "missing low_freq_factor"),
    ({"num_key_value_heads": 5}, "multiple of num_key_value_heads"),
    ({"hidden_size": "big"}, "hidden_size must be a positive integer"),
])
def test_rejected_configs(tmp_path, change, needle):
    with pytest.raises(UnsupportedModel) as e:
        load_config(write(tmp_path, {**BASE, **change}))
    assert needle in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("key", ["hidden_size", "num_hidden_layers", "vocab_size", "intermediate_size",
                                 "max_position_embeddings", "rms_norm_eps"])
def test_missing_key(tmp_path, key):
    raw = {k: v for k, v in BASE.items() if k != key}
    with pytest.raises(UnsupportedModel, match=f"missing required key '{key}'"):
        load_config(write(tmp_path, raw))


def test_no_config_and_bad_json(tmp_path):
    with pytest.raises(UnsupportedModel, match="no config.json"):
        load_config(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(UnsupportedModel, match="not valid JSON"):
        load_config(tmp_path)


def test_head_dim_from_hidden_and_kv_default(tmp_path):
    raw = {k: v for k, v in BASE.items() if k != "num_key_value_heads"}
    cfg = parse_config(raw, tmp_path / "config.json")
    assert cfg.shapes.n_kv_heads == 32 and cfg.shapes.head_dim == 64
