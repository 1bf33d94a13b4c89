"""Qwen2 / Qwen2.5 (`Qwen2ForCausalLM`): Llama with a bias on the q, k and v projections (HF
`self_attn.{q,k,v}_proj.bias`). Each biased projection is its linear op followed by a `bias_add` op (the [1, out]
bias row added to every row; for v, into the KV cache). Tied or untied heads as in Llama. Sliding-window layers
(`use_sliding_window`) are refused."""
from __future__ import annotations

from .family import Family
from .llama import LlamaModel, ModelShapes

# Qwen2.5-1.5B(-Instruct) config.json (tied embeddings)
QWEN25_1P5B = ModelShapes(hidden=1536, n_heads=12, n_kv_heads=2, head_dim=128, ffn=8960, vocab=151936,
                          n_layers=28, rms_eps=1e-6)


class Qwen2Model(LlamaModel):
    """Llama + q/k/v projection biases."""

    qkv_bias = True


FAMILY = Family("Qwen2ForCausalLM", "qwen2", Qwen2Model,
                "q/k/v projection biases: a bias_add launch after each of the three projections")
