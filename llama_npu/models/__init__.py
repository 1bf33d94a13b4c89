"""Model descriptions: one per family (config -> shapes, tensor map, layer graph -> phase modules), registered
in ONE table keyed by the Hugging Face architecture name."""
from __future__ import annotations

from . import gemma3
from .llama import LlamaModel, ModelShapes, QKNormLlama

# architecture (config.json "architectures") -> (model_type, description class, parser of the family's own
# config.json keys or None); one line per family. llama_npu.config validates the config first.
ARCHITECTURES = {
    "LlamaForCausalLM": ("llama", LlamaModel, None),
    "Qwen3ForCausalLM": ("qwen3", QKNormLlama, None),
    "Gemma3ForCausalLM": ("gemma3_text", gemma3.Gemma3Model, gemma3.parse_options),
}
# config.json model_type -> description class
FAMILIES = {model_type: model for model_type, model, _ in ARCHITECTURES.values()}


def model_for(cfg, weights: str = "bf16") -> LlamaModel:
    """The description of a validated ModelConfig's family (`weights`: bf16, or q4 decode GEMVs)."""
    return FAMILIES[cfg.family].from_config(cfg, weights)


__all__ = ["ARCHITECTURES", "FAMILIES", "LlamaModel", "ModelShapes", "QKNormLlama", "model_for"]
