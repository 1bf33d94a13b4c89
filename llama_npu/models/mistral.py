"""Mistral (`MistralForCausalLM`): the Llama layer (same tensor names, GQA, SwiGLU, RMSNorm, no biases) with
`sliding_window`: a query sees the last `sliding_window` keys. The description is LlamaModel's with the attention
op's `window` (LlamaModel.sliding_window); a call past the window reads only the cache rows its queries see
(docs/families.md "Sliding windows")."""
from __future__ import annotations

from .family import Family, sliding_window_option
from .llama import LlamaModel, ModelShapes

# Mistral-7B-v0.3 config.json (sliding_window null; v0.1: 4096 and a 32000 vocabulary)
MISTRAL_7B = ModelShapes(hidden=4096, n_heads=32, n_kv_heads=8, head_dim=128, ffn=14336, vocab=32768, n_layers=32,
                         rms_eps=1e-5)

FAMILY = Family("MistralForCausalLM", "mistral", LlamaModel,
                "sliding_window: the attention op's window (a call past it reads only the window's cache rows)",
                sliding_window_option, honours_sliding_window=True)
