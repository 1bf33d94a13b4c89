"""Read and validate a Llama-family config.json *before* any weight is touched.

Only the math we implement is accepted: RMSNorm, GQA attention, SwiGLU (silu) MLP, RoPE (default, the `llama3`
scaling of Llama 3.1/3.2, or `longrope`), tied or untied embeddings, for the architectures of
llama_npu.models.ARCHITECTURES (Llama, Qwen2/2.5, Qwen3, Mistral, Phi-3/3.5/4-mini; each family's own keys are
read by its description file). Everything else is rejected with one UnsupportedModel line naming the offending
key, before any weight is read.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from .errors import UnsupportedModel
from .models import ARCHITECTURES
from .models.llama import ROPE_TABLE, ModelShapes

# model_type -> the architecture class name HF writes for it (llama_npu.models.ARCHITECTURES has the families)
SUPPORTED = {f.model_type: a for a, f in ARCHITECTURES.items()}
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
    family: str = "LlamaForCausalLM"    # llama_npu.models.ARCHITECTURES key
    sliding_window: int | None = None   # the family's window (attention `window`: a query sees its last W keys)
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
    if rope_type in ("longrope", "su"):   # "su": the early Phi-3-128k name of longrope (transformers maps it)
        return RopeParams(float(theta), _longrope(cfg, scaling, path))
    if rope_type == "linear":    # positions divided by `factor` (Gemma 3 4B+ global layers)
        f = scaling.get("factor")
        if isinstance(f, bool) or not isinstance(f, (int, float)) or f <= 0:
            raise UnsupportedModel(f"{path}: linear rope_scaling needs a positive factor, got {f!r}")
        return RopeParams(float(theta), {"rope_type": "linear", "factor": float(f)})
    if rope_type != "llama3":
        raise UnsupportedModel(
            f"{path}: unsupported rope_scaling type {rope_type!r} (supported: default, linear, llama3, longrope)")
    missing = [k for k in LLAMA3_ROPE_KEYS if not isinstance(scaling.get(k), (int, float))]
    if missing:
        raise UnsupportedModel(f"{path}: llama3 rope_scaling is missing {', '.join(missing)}")
    norm = {"rope_type": "llama3", **{k: float(scaling[k]) for k in LLAMA3_ROPE_KEYS}}
    norm["original_max_position_embeddings"] = int(scaling["original_max_position_embeddings"])
    return RopeParams(float(theta), norm)


def _longrope(cfg: dict, scaling: dict, path: Path) -> dict:
    """LongRoPE (Phi-3.5 / Phi-4-mini), as transformers' _compute_longrope_parameters: short/long factors per
    frequency, original_max_position_embeddings (in the scaling dict or top level), the attention factor (given,
    else sqrt(1 + ln(factor) / ln(original)) with factor = max_position_embeddings / original)."""
    orig = scaling.get("original_max_position_embeddings", cfg.get("original_max_position_embeddings"))
    if isinstance(orig, bool) or not isinstance(orig, int) or orig <= 0:
        raise UnsupportedModel(f"{path}: longrope rope_scaling needs original_max_position_embeddings")
    factors = {}
    for key in ("short_factor", "long_factor"):
        f = scaling.get(key)
        if not isinstance(f, (list, tuple)) or not f or not all(isinstance(v, (int, float)) and v > 0 for v in f):
            raise UnsupportedModel(f"{path}: longrope rope_scaling needs {key} (a list of positive numbers)")
        factors[key] = tuple(float(v) for v in f)
    factor = scaling.get("factor") or cfg.get("max_position_embeddings", orig) / orig
    att = scaling.get("attention_factor")
    if att is None:
        att = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(orig))
    return {"rope_type": "longrope", **factors, "original_max_position_embeddings": orig,
            "attention_factor": float(att)}


def _family(cfg: dict, path: Path):
    """The family of config.json's architecture (or model_type), or one UnsupportedModel line listing them."""
    archs = cfg.get("architectures") or []
    model_type = cfg.get("model_type")
    name = archs[0] if archs else SUPPORTED.get(model_type)
    fam = ARCHITECTURES.get(name)
    if fam is None or fam.model_type != model_type:
        shown = ", ".join(archs) if archs else f"model_type={model_type!r}"
        raise UnsupportedModel(f"{path}: unsupported architecture {shown} (llama-npu runs: "
                               f"{', '.join(f'{a} / {f.model_type!r}' for a, f in ARCHITECTURES.items())})")
    return fam


def parse_config(cfg: dict, path: Path, model_dir: Path | None = None,
                 generation: dict | None = None) -> ModelConfig:
    fam = _family(cfg, path)
    options = fam.options(cfg, path)   # first: a family reading its own layer_types names what it refuses
    mixed = any(t not in ("full_attention", "sliding_attention") for t in cfg.get("layer_types") or [])
    sliding = cfg.get("use_sliding_window") or any(t != "full_attention" for t in cfg.get("layer_types") or [])
    if mixed or (sliding and not fam.honours_sliding_window):
        raise UnsupportedModel(f"{path}: sliding-window attention layers are not supported for {fam.architecture}")
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
    if act != "silu" and "activation" not in options:
        raise UnsupportedModel(f"{path}: unsupported hidden_act {act!r} (Llama uses silu / SwiGLU)")
    for key in ("attention_bias", "mlp_bias"):
        if cfg.get(key) and not (key == "attention_bias" and fam.model.qkv_bias):
            raise UnsupportedModel(f"{path}: {key}=true is not supported (Llama projections have no bias)")
    if "ropes" in options:   # a family with several RoPE tables: state name -> its config keys
        options = {**options, "ropes": {name: parse_rope(spec, path) for name, spec in options["ropes"].items()}}
    rope = options.get("ropes", {}).get(ROPE_TABLE) or parse_rope(cfg, path)
    generation = generation or {}
    eos = _ids(generation.get("eos_token_id")) + _ids(cfg.get("eos_token_id"))
    bos = generation.get("bos_token_id", cfg.get("bos_token_id"))
    shapes = ModelShapes(hidden=hidden, n_heads=n_heads, n_kv_heads=n_kv, head_dim=head_dim, ffn=ffn,
                         vocab=vocab, n_layers=n_layers, rms_eps=float(eps), rotary_dim=options.get("rotary_dim", 0))
    if rope.scaling and rope.scaling["rope_type"] == "longrope":
        for key in ("short_factor", "long_factor"):
            if len(rope.scaling[key]) != shapes.rot // 2:
                raise UnsupportedModel(f"{path}: longrope {key} has {len(rope.scaling[key])} entries, "
                                       f"rotary dims / 2 = {shapes.rot // 2}")
    window = options.get("sliding_window")
    return ModelConfig(model_dir=Path(model_dir or path.parent), shapes=shapes, rope=rope,
                       tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
                       max_position=max_pos,
                       eos_ids=tuple(dict.fromkeys(eos)), bos_id=bos if isinstance(bos, int) else None,
                       family=fam.architecture, sliding_window=window, raw=cfg, options=options)


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
