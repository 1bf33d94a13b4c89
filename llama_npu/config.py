"""Read and validate a Llama-family config.json *before* any weight is touched.

Only the math we implement is accepted: RMSNorm, GQA attention without biases, SwiGLU (silu) MLP,
RoPE (default or the `llama3` scaling of Llama 3.1/3.2), tied or untied embeddings; the Llama family
(`llama`) and its Qwen3 variant (`qwen3`: per-head q/k RMSNorm, full attention only). Everything else is
rejected with one UnsupportedModel line naming the offending key.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from .errors import UnsupportedModel
from .models import ARCHITECTURES
from .models.llama import ROPE_TABLE, ModelShapes

# model_type -> the architecture class name HF writes for it (llama_npu.models.ARCHITECTURES has the families)
SUPPORTED = {model_type: arch for arch, (model_type, _, _) in ARCHITECTURES.items()}
OPTIONS = {model_type: parse for model_type, _, parse in ARCHITECTURES.values()}   # a family's own keys
LLAMA3_ROPE_KEYS = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")


@dataclass(frozen=True)
class RopeParams:
    theta: float
    # None for plain RoPE; otherwise {"rope_type": "llama3", factor, low_freq_factor, high_freq_factor,
    # original_max_position_embeddings} (the HF rope_scaling dict, normalised).
    scaling: dict | None = None


@dataclass(frozen=True)
class ModelConfig:
    model_dir: Path
    shapes: ModelShapes
    rope: RopeParams
    tie_embeddings: bool
    max_position: int                   # max_position_embeddings: the model's context
    eos_ids: tuple[int, ...]            # from generation_config.json + config.json
    bos_id: int | None
    family: str = "llama"               # llama_npu.models.FAMILIES key
    raw: dict = field(repr=False, compare=False, default_factory=dict)
    options: dict = field(repr=False, compare=False, default_factory=dict)   # the family's own keys, parsed


def _read_json(path: Path, what: str) -> dict:
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise UnsupportedModel(f"{path}: {what} is not valid JSON ({e.msg} at line {e.lineno})") from None
    if not isinstance(data, dict):
        raise UnsupportedModel(f"{path}: {what} is not a JSON object")
    return data


def _ids(value) -> list[int]:
    if value is None:
        return []
    if isinstance(value, int):
        return [value]
    return [int(v) for v in value if isinstance(v, int)]


def _require(cfg: dict, key: str, path: Path, kind=int):
    if key not in cfg or cfg[key] is None:
        raise UnsupportedModel(f"{path}: missing required key {key!r}")
    value = cfg[key]
    if kind is int and (not isinstance(value, int) or isinstance(value, bool) or value <= 0):
        raise UnsupportedModel(f"{path}: {key} must be a positive integer, got {value!r}")
    if kind is float and (not isinstance(value, (int, float)) or value <= 0):
        raise UnsupportedModel(f"{path}: {key} must be a positive number, got {value!r}")
    return value


def parse_rope(cfg: dict, path: Path) -> RopeParams:
    """RoPE settings from either the transformers-4 keys (rope_theta + rope_scaling) or the
    transformers-5 `rope_parameters` dict."""
    params = cfg.get("rope_parameters")
    scaling = cfg.get("rope_scaling")
    theta = cfg.get("rope_theta")
    if isinstance(params, dict):
        theta = params.get("rope_theta", theta)
        scaling = params if scaling is None else scaling
    if theta is None:
        theta = 10000.0  # the HF Llama default when the key is absent
    if not isinstance(theta, (int, float)) or theta <= 0:
        raise UnsupportedModel(f"{path}: rope_theta must be a positive number, got {theta!r}")
    if not scaling:
        return RopeParams(float(theta), None)
    if not isinstance(scaling, dict):
        raise UnsupportedModel(f"{path}: rope_scaling must be an object, got {scaling!r}")
    rope_type = scaling.get("rope_type", scaling.get("type", "default"))
    if rope_type == "default":
        return RopeParams(float(theta), None)
    if rope_type == "linear":    # positions divided by `factor` (Gemma 3 4B+ global layers)
        f = scaling.get("factor")
        if isinstance(f, bool) or not isinstance(f, (int, float)) or f <= 0:
            raise UnsupportedModel(f"{path}: linear rope_scaling needs a positive factor, got {f!r}")
        return RopeParams(float(theta), {"rope_type": "linear", "factor": float(f)})
    if rope_type != "llama3":
        raise UnsupportedModel(
            f"{path}: unsupported rope_scaling type {rope_type!r} (supported: default, linear, llama3)")
    missing = [k for k in LLAMA3_ROPE_KEYS if not isinstance(scaling.get(k), (int, float))]
    if missing:
        raise UnsupportedModel(f"{path}: llama3 rope_scaling is missing {', '.join(missing)}")
    norm = {"rope_type": "llama3", **{k: float(scaling[k]) for k in LLAMA3_ROPE_KEYS}}
    norm["original_max_position_embeddings"] = int(scaling["original_max_position_embeddings"])
    return RopeParams(float(theta), norm)


def parse_config(cfg: dict, path: Path, model_dir: Path | None = None,
                 generation: dict | None = None) -> ModelConfig:
    archs = cfg.get("architectures") or []
    model_type = cfg.get("model_type")
    if model_type not in SUPPORTED or (archs and SUPPORTED[model_type] not in archs):
        shown = ", ".join(archs) if archs else f"model_type={model_type!r}"
        raise UnsupportedModel(
            f"{path}: unsupported architecture {shown} (llama-npu runs Llama-family models: "
            f"{', '.join(f'{a} / {t!r}' for t, a in SUPPORTED.items())})")
    parse_options = OPTIONS[model_type]
    options = parse_options(cfg, path) if parse_options else {}
    if not parse_options and (cfg.get("use_sliding_window")
                              or any(t != "full_attention" for t in cfg.get("layer_types") or [])):
        raise UnsupportedModel(f"{path}: sliding-window attention layers are not supported")
    hidden = _require(cfg, "hidden_size", path)
    n_heads = _require(cfg, "num_attention_heads", path)
    n_layers = _require(cfg, "num_hidden_layers", path)
    ffn = _require(cfg, "intermediate_size", path)
    vocab = _require(cfg, "vocab_size", path)
    max_pos = _require(cfg, "max_position_embeddings", path)
    eps = _require(cfg, "rms_norm_eps", path, float)
    n_kv = cfg.get("num_key_value_heads") or n_heads
    if not isinstance(n_kv, int) or n_heads % n_kv:
        raise UnsupportedModel(
            f"{path}: num_attention_heads ({n_heads}) must be a multiple of num_key_value_heads ({n_kv})")
    head_dim = cfg.get("head_dim")
    if head_dim is None:
        if hidden % n_heads:
            raise UnsupportedModel(f"{path}: hidden_size {hidden} is not divisible by num_attention_heads {n_heads}")
        head_dim = hidden // n_heads
    if not isinstance(head_dim, int) or head_dim <= 0 or head_dim % 2:
        raise UnsupportedModel(f"{path}: head_dim must be a positive even integer, got {head_dim!r}")
    act = options.get("activation") or cfg.get("hidden_act", "silu")
    if act != "silu" and not parse_options:
        raise UnsupportedModel(f"{path}: unsupported hidden_act {act!r} (Llama uses silu / SwiGLU)")
    for key in ("attention_bias", "mlp_bias"):
        if cfg.get(key):
            raise UnsupportedModel(f"{path}: {key}=true is not supported (Llama projections have no bias)")
    if "ropes" in options:   # a family with several RoPE tables: state name -> its config keys
        options = {**options, "ropes": {name: parse_rope(spec, path) for name, spec in options["ropes"].items()}}
    rope = options.get("ropes", {}).get(ROPE_TABLE) or parse_rope(cfg, path)
    generation = generation or {}
    eos = _ids(generation.get("eos_token_id")) + _ids(cfg.get("eos_token_id"))
    bos = generation.get("bos_token_id", cfg.get("bos_token_id"))
    shapes = ModelShapes(hidden=hidden, n_heads=n_heads, n_kv_heads=n_kv, head_dim=head_dim, ffn=ffn,
                         vocab=vocab, n_layers=n_layers, rms_eps=float(eps))
    return ModelConfig(model_dir=Path(model_dir or path.parent), shapes=shapes, rope=rope,
                       tie_embeddings=bool(cfg.get("tie_word_embeddings", False)), max_position=max_pos,
                       eos_ids=tuple(dict.fromkeys(eos)), bos_id=bos if isinstance(bos, int) else None,
                       family=model_type, raw=cfg, options=options)


def load_config(model_dir: str | Path) -> ModelConfig:
    """Validate `model_dir/config.json` (+ generation_config.json); raises UnsupportedModel."""
    model_dir = Path(model_dir)
    path = model_dir / "config.json"
    if not path.is_file():
        raise UnsupportedModel(f"{model_dir}: no config.json (not a Hugging Face model directory)")
    cfg = _read_json(path, "config.json")
    gen_path = model_dir / "generation_config.json"
    generation = _read_json(gen_path, "generation_config.json") if gen_path.is_file() else {}
    return parse_config(cfg, path, model_dir, generation)


def select_buckets(buckets: Sequence[int], context: int) -> tuple[int, ...]:
    """Sorted unique buckets that fit the model's context; a context smaller than every bucket gets one
    bucket: the largest the kernels take that fits it (llama_npu.sizes.BUCKET_MULTIPLE)."""
    from .errors import ContextError
    from .sizes import BUCKET_MULTIPLE, MIN_CONTEXT

    bs = sorted({int(b) for b in buckets})
    if not bs or bs[0] <= 0:
        raise ValueError(f"prefill buckets must be positive integers, got {list(buckets)}")
    if context < MIN_CONTEXT:
        raise ContextError(f"a context of {context} positions is too small: a run needs at least {MIN_CONTEXT}")
    fit = tuple(b for b in bs if b <= context)
    return fit or (context // BUCKET_MULTIPLE * BUCKET_MULTIPLE,)
