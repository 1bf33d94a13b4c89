"""`llama-npu check-lowering` on config-only directories of every family (tiny widths, 2 layers, a fake lowering
tool that accepts everything): its table has one row per module the runtime plans for that model
(llama_npu.sizes.plan_modules, both decode-attention placements, the one-dispatch token modules where the family
has them) - Gemma 3's local and global variants, a sliding window's `layer_slide*` / `attn_*_slide*` modules,
Qwen2's biased projections - and no other row. The real lowering of the real-width configurations is
docs/verification.md ("Real lowering")."""
from __future__ import annotations

import json

import pytest

from llama_npu.cli import main
from test_check_lowering import _rows, _tool

ARGS = ["--buckets", "64", "--context", "512", "--no-progress"]
BASE = {"hidden_size": 256, "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 512,
        "num_hidden_layers": 2, "vocab_size": 512, "max_position_embeddings": 4096, "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0, "tie_word_embeddings": True, "torch_dtype": "bfloat16"}
CONFIGS = {
    "qwen2": {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "use_sliding_window": False},
    "mistral": {"architectures": ["MistralForCausalLM"], "model_type": "mistral", "sliding_window": 128,
                "tie_word_embeddings": False},
    "phi3": {"architectures": ["Phi3ForCausalLM"], "model_type": "phi3", "partial_rotary_factor": 0.75,
             "sliding_window": 262144},
    "gemma3": {"architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text", "num_key_value_heads": 1,
               "head_dim": 64, "hidden_activation": "gelu_pytorch_tanh", "sliding_window": 128,
               "layer_types": ["sliding_attention", "full_attention"], "query_pre_attn_scalar": 64,
               "rope_local_base_freq": 10000.0, "final_logit_softcapping": None, "attn_logit_softcapping": None},
}


def _runtime_modules(model_dir) -> set[str]:
    """The names of every module the runtime plans for this model at ARGS' buckets and context."""
    from llama_npu.config import load_config
    from llama_npu.models import model_for
    from llama_npu.sizes import plan_modules

    cfg = load_config(model_dir)
    model = model_for(cfg)
    return {d.name for placement in ("npu", "host") for d in plan_modules(model, cfg, (64,), 512, placement)}


@pytest.mark.parametrize("family", list(CONFIGS))
def test_check_lowering_lists_what_the_runtime_builds(tmp_path, monkeypatch, capsys, family):
    monkeypatch.setenv("LLAMA_NPU_CACHE", str(tmp_path / "cache"))
    d = tmp_path / family
    d.mkdir()
    (d / "config.json").write_text(json.dumps({**BASE, **CONFIGS[family]}))
    assert main(["check-lowering", "--model", str(d), "--tool", _tool(tmp_path), *ARGS]) == 0
    rows = _rows(capsys.readouterr().out)
    expected = _runtime_modules(d)
    assert set(rows) == expected and all(r[1] == "OK" for r in rows.values())
    names = " ".join(sorted(rows))
    assert {"lm_head", "ffn_dec", "layer_kv256"} <= set(rows) or family == "mistral", names
    if family == "gemma3":      # two layer variants; embedding scale and variants: no one-dispatch token module
        assert {"layer_slide128_local", "qkv_dec_local", "qkv_s64_local"} <= set(rows), names
        assert not any(n.startswith("token_") for n in rows), names
    else:
        assert {"token_kv256", "token_kv512"} <= set(rows), names
    if family == "mistral":     # window 128: every decode layer reads the window's rows
        assert [n for n in rows if n.startswith("layer_")] == ["layer_slide128"], names
