"""Gemma 3 text (`Gemma3ForCausalLM`, model_type `gemma3_text`), described as what differs from the Llama layer
(docs/families.md "Gemma 3"):

- the embedding rows are scaled by sqrt(hidden) in bf16 (HF's Gemma3TextScaledWordEmbedding): a host step on the
  gathered rows (`embed_rows`); the tied LM head reads the unscaled table;
- every RMSNorm multiplies by (1 + w), added in f32: the rmsnorm kernel's `offset` flag (folding the 1 into the
  stored bf16 weight is not exact: 1 + w needs more than bf16's 8 significant bits for most w);
- four norms per layer: input and post-attention (on the attention output, before the residual add), pre- and
  post-feed-forward (on the MLP output, before the residual add);
- per-head q/k RMSNorm before RoPE (Qwen3's ops, with the offset);
- GeGLU with the tanh-approximated GELU: the geglu kernel in place of swiglu;
- the softmax scale is query_pre_attn_scalar^-1/2 (the attention kernel's `scale_dim`);
- sliding-window (local) layers beside global ones (`layer_types`, or `sliding_window_pattern` in older
  configs): the attention kernel's `window`, and a RoPE table of their own base (`rope_local_base_freq`, or
  rope_parameters["sliding_attention"]) in a second shared state `rope_local`. The two kinds of layer are two
  variants of the layer graph: their modules are `..._local` (local) and the plain names (global); the FFN
  module is the same for both;
- final logit soft-capping (`final_logit_softcapping`) on the host logits; attention soft-capping is refused.
"""
from __future__ import annotations

import functools
import math
from pathlib import Path

import numpy as np

from kernel_builder.numerics import F32, to_bf16

from ..errors import UnsupportedModel
from .family import Family
from .graph import LayerGraph, Op, State, Weight
from .llama import K_CACHE, ROPE_TABLE, V_CACHE, LlamaModel, ModelShapes

ROPE_LOCAL = "rope_local"        # the sliding layers' RoPE table (a shared state beside `rope`)
LOCAL, GLOBAL = "local", ""      # layer variants: sliding-window and global attention
LAYER_TYPES = {"sliding_attention": LOCAL, "full_attention": GLOBAL}

GEMMA3_TENSORS = {
    "attn_norm": "input_layernorm.weight",
    "wq": "self_attn.q_proj.weight",
    "wk": "self_attn.k_proj.weight",
    "wv": "self_attn.v_proj.weight",
    "q_norm": "self_attn.q_norm.weight",
    "k_norm": "self_attn.k_norm.weight",
    "wo": "self_attn.o_proj.weight",
    "post_attn_norm": "post_attention_layernorm.weight",
    "ffn_norm": "pre_feedforward_layernorm.weight",
    "w_gate": "mlp.gate_proj.weight",
    "w_up": "mlp.up_proj.weight",
    "w_down": "mlp.down_proj.weight",
    "post_ffn_norm": "post_feedforward_layernorm.weight",
}

# Gemma-3-1B's layer widths (config.json of google/gemma-3-1b-pt): 26 layers, every 6th global.
GEMMA3_1B = ModelShapes(hidden=1152, n_heads=4, n_kv_heads=1, head_dim=256, ffn=6912, vocab=262144, n_layers=26,
                        rms_eps=1e-6)
GEMMA3_1B_OPTIONS = {"layer_types": tuple(GLOBAL if (i + 1) % 6 == 0 else LOCAL for i in range(26)),
                     "window": 512, "scale_dim": 256, "softcap": None}


class Gemma3Model(LlamaModel):
    """The Gemma 3 decoder layer (see the module doc); `layer_types` holds each layer's variant (LOCAL or
    GLOBAL), `sliding_window` the local layers' window, `scale_dim` query_pre_attn_scalar, `softcap` the final
    logit soft-cap (None: none)."""

    qk_norm = True
    shared_states = (ROPE_TABLE, ROPE_LOCAL)

    def __init__(self, shapes: ModelShapes, layer_types=None, sliding_window: int | None = None,
                 scale_dim: int | None = None, softcap: float | None = None, rope_local=None,
                 weights: str = "bf16"):
        super().__init__(shapes, weights)
        self.layer_types = tuple(layer_types or (GLOBAL,) * shapes.n_layers)
        if len(self.layer_types) != shapes.n_layers or set(self.layer_types) - {LOCAL, GLOBAL}:
            raise ValueError(f"gemma3: layer_types must be {shapes.n_layers} of {LOCAL!r} / {GLOBAL!r}")
        if LOCAL in self.layer_types and not sliding_window:
            raise ValueError("gemma3: sliding layers need a sliding_window")
        self.sliding_window = sliding_window
        self.scale_dim = scale_dim or shapes.head_dim
        self.softcap = softcap
        self.rope_local = rope_local
        self.layer_variants = tuple(v for v in (LOCAL, GLOBAL) if v in self.layer_types)

    @classmethod
    def from_config(cls, cfg, weights: str = "bf16") -> "Gemma3Model":
        o = cfg.options
        return cls(cfg.shapes, o["layer_types"], o["window"], o["scale_dim"], o["softcap"],
                   o["ropes"].get(ROPE_LOCAL), weights)

    # ------------------------------------------------------------------------------ host-side hooks
    def variant_of(self, layer: int) -> str:
        return self.layer_types[layer]

    def window_of(self, variant: str = GLOBAL) -> int | None:
        return self.sliding_window if variant == LOCAL else None

    def rope_tables(self, cfg) -> dict:
        tables = {}
        if GLOBAL in self.layer_types:
            tables[ROPE_TABLE] = cfg.rope
        if LOCAL in self.layer_types:
            tables[ROPE_LOCAL] = self.rope_local or cfg.options["ropes"][ROPE_LOCAL]
        return tables

    def embed_rows(self, x: np.ndarray) -> np.ndarray:
        """x * sqrt(hidden), both bf16 (HF multiplies by embed_scale cast to the weight dtype): one rounding of
        an exact f32 product."""
        scale = to_bf16(np.asarray([math.sqrt(self.shapes.hidden)], dtype=F32)).astype(F32)[0]
        return to_bf16(x.astype(F32) * scale)

    def final_logits(self, logits: np.ndarray) -> np.ndarray:
        if not self.softcap:
            return logits
        cap = F32(self.softcap)
        return (np.tanh(logits / cap) * cap).astype(F32)

    # ------------------------------------------------------------------------------ tensor map and graph
    def layer_tensors(self) -> dict[str, tuple[str, tuple[int, ...]]]:
        s = self.shapes
        shapes = {"wq": (s.q_dim, s.hidden), "wk": (s.kv_dim, s.hidden), "wv": (s.kv_dim, s.hidden),
                  "wo": (s.hidden, s.q_dim), "w_gate": (s.ffn, s.hidden), "w_up": (s.ffn, s.hidden),
                  "w_down": (s.hidden, s.ffn), "q_norm": (s.head_dim,), "k_norm": (s.head_dim,)}
        return {w: (hf, shapes.get(w, (s.hidden,))) for w, hf in GEMMA3_TENSORS.items()}

    @property
    def graph(self) -> LayerGraph:
        return self.layer_graph(self.layer_variants[-1])

    @functools.lru_cache(maxsize=None)
    def layer_graph(self, variant: str = GLOBAL) -> LayerGraph:
        s = self.shapes
        hd = s.head_dim
        norm = {"eps": s.rms_eps, "offset": 1}
        head_norm = dict(norm, group=hd)
        table = ROPE_LOCAL if variant == LOCAL else ROPE_TABLE
        attn = {"heads": s.n_heads, "kv_heads": s.n_kv_heads, "head_dim": hd,
                "window": self.sliding_window if variant == LOCAL else None,
                "scale_dim": self.scale_dim if self.scale_dim != hd else None}
        ops = [
            Op("rmsnorm", ("x", Weight("attn_norm")), "h", s.hidden, norm),
            Op("linear", ("h", Weight("wq")), "q", s.q_dim),
            Op("linear", ("h", Weight("wk")), "k", s.kv_dim),
            Op("linear", ("h", Weight("wv")), "v_new", s.kv_dim, into=V_CACHE),
            Op("rmsnorm", ("q", Weight("q_norm")), "q_n", s.q_dim, head_norm),
            Op("rmsnorm", ("k", Weight("k_norm")), "k_n", s.kv_dim, head_norm),
            Op("rope", ("q_n", State(table)), "q_roped", s.q_dim),
            Op("rope", ("k_n", State(table)), "k_new", s.kv_dim, into=K_CACHE),
            Op("attention", ("q_roped", State(K_CACHE), State(V_CACHE)), "attn", s.q_dim, attn),
            Op("linear", ("attn", Weight("wo")), "proj", s.hidden),
            Op("rmsnorm", ("proj", Weight("post_attn_norm")), "proj_n", s.hidden, norm),
            Op("add", ("x", "proj_n"), "res1", s.hidden),
            Op("rmsnorm", ("res1", Weight("ffn_norm")), "h2", s.hidden, norm),
            Op("linear", ("h2", Weight("w_gate")), "gate", s.ffn),
            Op("linear", ("h2", Weight("w_up")), "up", s.ffn),
            Op("geglu", ("gate", "up"), "act", s.ffn),
            Op("linear", ("act", Weight("w_down")), "down", s.hidden),
            Op("rmsnorm", ("down", Weight("post_ffn_norm")), "down_n", s.hidden, norm),
            Op("add", ("res1", "down_n"), "x_out", s.hidden),
        ]
        return LayerGraph("x", s.hidden, ("x_out",), ops,
                          {K_CACHE: s.kv_dim, V_CACHE: s.kv_dim, ROPE_TABLE: hd, ROPE_LOCAL: hd}, weights=self.weights,
                          q4_group=self.q4_group)

    @functools.cached_property
    def head_graph(self) -> LayerGraph:
        s = self.shapes
        ops = [Op("rmsnorm", ("x", Weight("final_norm")), "x_norm", s.hidden, {"eps": s.rms_eps, "offset": 1})]
        ops += [Op("linear", ("x_norm", Weight(f"lm_{p}")), f"logits_{p}", self.lm_rows) for p in range(self.lm_parts)]
        return LayerGraph("x", s.hidden, tuple(f"logits_{p}" for p in range(self.lm_parts)), ops, {},
                          weights=self.head_weights, q4_group=self.head_group)


# ---------------------------------------------------------------------------------------------- config.json
def _positive_int(cfg: dict, key: str, path: Path, default=None) -> int:
    v = cfg.get(key, default)
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
        raise UnsupportedModel(f"{path}: {key} must be a positive integer, got {v!r}")
    return v


def _layer_types(cfg: dict, path: Path) -> tuple[str, ...]:
    n = _positive_int(cfg, "num_hidden_layers", path)
    types = cfg.get("layer_types")
    if types is None:   # transformers-4 configs: every `sliding_window_pattern`-th layer is global
        pattern = _positive_int(cfg, "sliding_window_pattern", path, cfg.get("_sliding_window_pattern", 6))
        types = ["full_attention" if (i + 1) % pattern == 0 else "sliding_attention" for i in range(n)]
    bad = [t for t in types if t not in LAYER_TYPES]
    if bad or len(types) != n:
        raise UnsupportedModel(f"{path}: layer_types must list {n} of {', '.join(LAYER_TYPES)}, got {types!r}")
    return tuple(LAYER_TYPES[t] for t in types)


def _ropes(cfg: dict) -> dict:
    """RoPE table state -> its settings as config.json keys (rope_theta, rope_scaling; llama_npu.config parses
    them), from transformers-5 rope_parameters (keyed by layer type) or the transformers-4 keys rope_theta /
    rope_scaling (global layers; Gemma 3 4B+ scale them linearly) and rope_local_base_freq (local layers)."""
    params = cfg.get("rope_parameters")
    if isinstance(params, dict) and set(params) & set(LAYER_TYPES):
        full, local = params.get("full_attention") or {}, params.get("sliding_attention") or {}
        return {ROPE_TABLE: {"rope_theta": full.get("rope_theta"), "rope_scaling": full},
                ROPE_LOCAL: {"rope_theta": local.get("rope_theta"), "rope_scaling": local}}
    return {ROPE_TABLE: {"rope_theta": cfg.get("rope_theta", 1e6), "rope_scaling": cfg.get("rope_scaling")},
            ROPE_LOCAL: {"rope_theta": cfg.get("rope_local_base_freq", 1e4)}}


def parse_options(cfg: dict, path: Path) -> dict:
    """Gemma 3's own config.json keys (UnsupportedModel for what we do not implement), before any weight."""
    act = cfg.get("hidden_activation") or cfg.get("hidden_act")
    if act not in ("gelu_pytorch_tanh",):
        raise UnsupportedModel(f"{path}: unsupported hidden_activation {act!r} (Gemma 3 uses gelu_pytorch_tanh)")
    if cfg.get("attn_logit_softcapping") is not None:
        raise UnsupportedModel(f"{path}: attn_logit_softcapping is not supported")
    if cfg.get("use_bidirectional_attention"):
        raise UnsupportedModel(f"{path}: use_bidirectional_attention is not supported (causal decoding only)")
    types = _layer_types(cfg, path)
    window = _positive_int(cfg, "sliding_window", path) if LOCAL in types else None
    cap = cfg.get("final_logit_softcapping")
    if cap is not None and (isinstance(cap, bool) or not isinstance(cap, (int, float)) or cap <= 0):
        raise UnsupportedModel(f"{path}: final_logit_softcapping must be a positive number or null, got {cap!r}")
    return {"layer_types": types, "window": window, "scale_dim": _positive_int(cfg, "query_pre_attn_scalar",
            path, 256), "softcap": float(cap) if cap else None, "ropes": _ropes(cfg), "activation": act}


# `window` (not `sliding_window`): the local layers' attention is windowed in the kernel, so the run's context is
# not capped (llama_npu.models.family)
FAMILY = Family("Gemma3ForCausalLM", "gemma3_text", Gemma3Model,
                "(1 + w) RMSNorms (4 per layer + q/k), GeGLU, sqrt(hidden)-scaled embedding, query_pre_attn_scalar, "
                "sliding-window layers (attention `window`) with their own RoPE table, final logit soft-cap",
                parse_options, honours_sliding_window=True)
