"""Mistral (`MistralForCausalLM`): the Llama layer (same tensor names, GQA, SwiGLU, RMSNorm, no biases) with
`sliding_window`: a query sees the last `sliding_window` keys. The description is LlamaModel's; the window is
honoured by keeping every run's context within it (llama_npu.config: max_position = min(max_position_embeddings,
sliding_window)), where windowed and full causal attention are the same."""
from __future__ import annotations

from .family import Family, sliding_window_option
from .llama import LlamaModel

FAMILY = Family("MistralForCausalLM", "mistral", LlamaModel,
                "sliding_window: the run's context is kept within the window (where it equals causal attention)",
                sliding_window_option, honours_sliding_window=True)
