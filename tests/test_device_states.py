"""llama_npu.states.DeviceStates: the device states come from the layer graphs' `states` (no hard-coded names):
per-layer buffers for the KV cache, one shared buffer per RoPE table the model names (written from the host as it
grows), growth by whole KV windows with the old rows kept, and one PromptError line past the run's context.
A recording stand-in for the executor: no module is built (fast)."""
from __future__ import annotations

import numpy as np
import pytest

from llama_npu.config import parse_config
from llama_npu.errors import PromptError
from llama_npu.models import model_for
from llama_npu.states import DeviceStates


class Recorder:
    def __init__(self):
        self.calls = []

    def define_state(self, name, rows, per_key=True):
        self.calls.append(("define", name, rows, per_key))

    def write_state(self, name, data, bo_key=None, start=0):
        self.calls.append(("write", name, start, np.asarray(data).shape[0]))


def _llama(tmp_path):
    raw = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 128,
           "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2, "intermediate_size": 256,
           "vocab_size": 512, "max_position_embeddings": 2048, "rms_norm_eps": 1e-5, "rope_theta": 10000.0}
    return parse_config(raw, tmp_path / "config.json")


def _gemma3(tmp_path):
    raw = {"architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text", "hidden_size": 128,
           "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 64, "num_hidden_layers": 6,
           "intermediate_size": 256, "vocab_size": 512, "max_position_embeddings": 1024, "rms_norm_eps": 1e-6,
           "hidden_activation": "gelu_pytorch_tanh", "sliding_window": 512, "sliding_window_pattern": 6,
           "query_pre_attn_scalar": 256, "rope_theta": 1000000.0, "rope_local_base_freq": 10000.0,
           "final_logit_softcapping": None, "attn_logit_softcapping": None, "tie_word_embeddings": True}
    return parse_config(raw, tmp_path / "config.json")


def test_llama_states_grow_by_window_and_keep_rows(tmp_path):
    cfg = _llama(tmp_path)
    rec = Recorder()
    st = DeviceStates(rec, model_for(cfg), cfg, context=1024)
    assert st.per_layer == ("k_cache", "v_cache") and list(st.ropes) == ["rope"]
    st.ensure(100)
    cap = st.capacity
    assert cap == min(w for w in st.windows if w >= 100)
    assert rec.calls == [("define", "k_cache", cap, True), ("define", "v_cache", cap, True),
                         ("define", "rope", cap, False), ("write", "rope", 0, cap)]
    rec.calls.clear()
    st.ensure(cap)                     # fits: nothing re-allocated
    assert rec.calls == []
    st.ensure(cap + 1)                 # the next window; only the new RoPE rows are written
    new = st.capacity
    assert new > cap and rec.calls[-1] == ("write", "rope", cap, new - cap)
    assert st.window(cap + 1) == new and st.window(10, rows=64) == 64


def test_beyond_context_is_one_line(tmp_path):
    cfg = _llama(tmp_path)
    st = DeviceStates(Recorder(), model_for(cfg), cfg, context=512)
    with pytest.raises(PromptError, match=r"position 512 is beyond this run's context of 512 tokens \(--context\)"):
        st.ensure(513)


def test_gemma3_states_include_both_rope_tables(tmp_path):
    cfg = _gemma3(tmp_path)
    rec = Recorder()
    st = DeviceStates(rec, model_for(cfg), cfg, context=1024)
    assert st.per_layer == ("k_cache", "v_cache") and sorted(st.ropes) == ["rope", "rope_local"]
    st.ensure(1)
    shared = {c[1] for c in rec.calls if c[0] == "define" and not c[3]}
    assert shared == {"rope", "rope_local"}
