"""Mistral (`MistralForCausalLM`): the Llama layer (same tensor names, GQA, SwiGLU, RMSNorm, no biases) with
`sliding_window`: a query sees the last `sliding_window` keys. The description is LlamaModel's; the window is
honoured by keeping every run's context within it (llama_npu.config: max_position = min(max_position_embeddings,
sliding_window)), where windowed and full causal attention are the same."""
from __future__ import annotations

from .family import Family, sliding_window_option
from .llama import LlamaModel, ModelShapes

# Mistral-7B-v0.3 config.json (sliding_window null; v0.1: 4096 and a 32000 vocabulary)
MISTRAL_7B = ModelShapes(hidden=4096, n_heads=32, n_kv_heads=8, head_dim=128, ffn=14336, vocab=32768, n_layers=32,
                         rms_eps=1e-5)

FAMILY = Family("MistralForCausalLM", "mistral", LlamaModel,
                "sliding_window: the run's context is kept within the window (where it equals causal attention)",
                sliding_window_option, honours_sliding_window=True)
