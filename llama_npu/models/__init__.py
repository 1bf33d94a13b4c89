"""Model descriptions: one per family (config -> shapes, tensor map, layer graph -> phase modules), each file
defining its `FAMILY` (llama_npu.models.family.Family), registered here in ONE table keyed by the Hugging Face
architecture name."""
from __future__ import annotations

from . import gemma3, mistral, phi3, qwen2
from .family import Family
from .llama import LLAMA_FAMILY, QWEN3_0P6B, QWEN3_1P7B, QWEN3_FAMILY, LlamaModel, ModelShapes, QKNormLlama

# architecture (config.json "architectures") -> family; llama_npu.config validates the config first
ARCHITECTURES: dict[str, Family] = {f.architecture: f for f in (
    LLAMA_FAMILY, QWEN3_FAMILY, qwen2.FAMILY, mistral.FAMILY, phi3.FAMILY, gemma3.FAMILY)}
FAMILIES = {a: f.model for a, f in ARCHITECTURES.items()}
# Real models' layer widths per family (tests, `make bench`): name -> (architecture, shapes)
FAMILY_SHAPES = {"qwen2.5-1.5b": ("Qwen2ForCausalLM", qwen2.QWEN25_1P5B),
                 "qwen3-0.6b": ("Qwen3ForCausalLM", QWEN3_0P6B), "qwen3-1.7b": ("Qwen3ForCausalLM", QWEN3_1P7B),
                 "mistral-7b": ("MistralForCausalLM", mistral.MISTRAL_7B),
                 "phi-4-mini": ("Phi3ForCausalLM", phi3.PHI4_MINI)}


def family_model(name: str, n_layers: int | None = None) -> LlamaModel:
    """The description of FAMILY_SHAPES[name] (optionally with fewer layers)."""
    import dataclasses

    arch, shapes = FAMILY_SHAPES[name]
    return FAMILIES[arch](dataclasses.replace(shapes, n_layers=n_layers) if n_layers else shapes)


def model_for(cfg, weights: str = "bf16", kv: str = "bf16") -> LlamaModel:
    """The description of a validated ModelConfig's family (`weights`: bf16, or q4: linear layers in 4 bits, in
    groups of the checkpoint's `quantization_config.group_size` for an AWQ/GPTQ one, else 32; `kv`: the KV cache's
    format, bf16 or int8, models/kv8.py)."""
    from ..quant import checkpoint_quantization

    model = FAMILIES[cfg.family].from_config(cfg, weights)
    if kv != "bf16":
        if kv not in LlamaModel.KV:
            raise ValueError(f"kv must be one of {', '.join(LlamaModel.KV)}, got {kv!r}")
        if type(model).layer_graph is not LlamaModel.layer_graph or model.sliding_window:
            raise ValueError(f"--kv {kv}: the {cfg.family} family's layers (sliding windows or variants) read the "
                             f"bf16 KV cache only")
        model.kv = kv
    qcfg = checkpoint_quantization(getattr(cfg, "raw", {}) or {}) if weights == "q4" else None
    if qcfg:                 # AWQ / GPTQ: the layers' group; their LM head is 16-bit
        model.q4_group, model.head_weights = int(qcfg["group_size"]), "bf16"
    return model


__all__ = ["ARCHITECTURES", "FAMILIES", "FAMILY_SHAPES", "family_model", "Family", "LlamaModel", "ModelShapes", "QKNormLlama", "model_for"]
