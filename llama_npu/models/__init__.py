"""Model descriptions: one per family (config -> shapes, tensor map, layer graph -> phase modules)."""
from __future__ import annotations

from .llama import LlamaModel, ModelShapes, QKNormLlama

# config.json model_type -> description class (llama_npu.config validates the config first)
FAMILIES = {"llama": LlamaModel, "qwen3": QKNormLlama}


def model_for(cfg, weights: str = "bf16") -> LlamaModel:
    """The description of a validated ModelConfig's family (`weights`: bf16, or q4 decode GEMVs)."""
    return FAMILIES[cfg.family](cfg.shapes, weights)


__all__ = ["FAMILIES", "LlamaModel", "ModelShapes", "QKNormLlama", "model_for"]
