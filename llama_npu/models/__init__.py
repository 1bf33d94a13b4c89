"""Model descriptions: one per family (config -> shapes, tensor map, layer graph -> phase modules), each file
defining its `FAMILY` (llama_npu.models.family.Family), registered here in ONE table keyed by the Hugging Face
architecture name."""
from __future__ import annotations

from . import mistral, phi3, qwen2
from .family import Family
from .llama import LLAMA_FAMILY, QWEN3_FAMILY, LlamaModel, ModelShapes, QKNormLlama

# architecture (config.json "architectures") -> family; llama_npu.config validates the config first
ARCHITECTURES: dict[str, Family] = {f.architecture: f for f in (
    LLAMA_FAMILY, QWEN3_FAMILY, qwen2.FAMILY, mistral.FAMILY, phi3.FAMILY)}
FAMILIES = {a: f.model for a, f in ARCHITECTURES.items()}


def model_for(cfg) -> LlamaModel:
    """The description of a validated ModelConfig's family."""
    return FAMILIES[cfg.family](cfg.shapes)


__all__ = ["ARCHITECTURES", "FAMILIES", "Family", "LlamaModel", "ModelShapes", "QKNormLlama", "model_for"]
