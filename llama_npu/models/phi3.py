"""Phi-3 / Phi-3.5 / Phi-4-mini (`Phi3ForCausalLM`): the Llama layer with

- fused projections: `self_attn.qkv_proj.weight` ([q_dim + 2 kv_dim, hidden]: q, k, v rows) and
  `mlp.gate_up_proj.weight` ([2 ffn, hidden]: gate, up rows), split at load: the graph's wq/wk/wv and
  (4-bit) w_gate/w_up are row ranges of the stored tensors (read straight into their buffers), the bf16
  w_gate_up its rows interleaved by 8 (llama.GATE_UP);
- partial rotary embedding (`partial_rotary_factor`: RoPE on the first rotary_dim dims of each head): the q/k rows
  are loaded in llama.rotary_order and the RoPE table rotates the pass-through pairs by angle 0;
- `longrope` scaling (short/long factors, attention factor): llama_npu.rope;
- `sliding_window` when set: as Mistral (the attention op's window).
"""
from __future__ import annotations

from pathlib import Path

from ..errors import UnsupportedModel
from .family import Family, sliding_window_option
from .llama import GATE_UP, LlamaModel, ModelShapes, TensorSpec, gate_up_index
from .lowering import BFP_SUFFIX, Q4_SUFFIX

# Phi-4-mini-instruct config.json: partial_rotary_factor 0.75 (96 of 128 dims), longrope, tied embeddings
PHI4_MINI = ModelShapes(hidden=3072, n_heads=24, n_kv_heads=8, head_dim=128, ffn=8192, vocab=200064, n_layers=32,
                        rms_eps=1e-5, rotary_dim=96)

FUSED = {"wq": "self_attn.qkv_proj.weight", "wk": "self_attn.qkv_proj.weight", "wv": "self_attn.qkv_proj.weight",
         "w_gate": "mlp.gate_up_proj.weight", "w_up": "mlp.gate_up_proj.weight"}


class Phi3Model(LlamaModel):
    """Llama with fused qkv / gate_up tensors (split at load) and partial rotary embedding."""

    def _fused_rows(self, arg: str) -> tuple[str, tuple[int, int], int, int]:
        """(HF name, stored shape, first row, rows) of a graph weight inside its fused tensor."""
        s = self.shapes
        if arg in ("wq", "wk", "wv"):
            first = {"wq": 0, "wk": s.q_dim, "wv": s.q_dim + s.kv_dim}[arg]
            return FUSED[arg], (s.q_dim + 2 * s.kv_dim, s.hidden), first, s.q_dim if arg == "wq" else s.kv_dim
        return FUSED[arg], (2 * s.ffn, s.hidden), 0 if arg == "w_gate" else s.ffn, s.ffn

    def checkpoint_tensors(self) -> list[tuple[str, tuple[int, ...]]]:
        plain = [v for w, v in self.layer_tensors().items() if w not in FUSED]
        return list(dict.fromkeys(plain + [self._fused_rows(w)[:2] for w in FUSED]))

    def static_tensor(self, arg: str, layer: int | None, lm_source: str = "lm_head") -> TensorSpec:
        base = arg.removesuffix(Q4_SUFFIX).removesuffix(BFP_SUFFIX)   # the same rows of the same tensor
        if layer is not None and base == GATE_UP:   # gate_up_proj IS [gate; up]: its rows interleaved by 8
            return TensorSpec(f"model.layers.{layer}.{FUSED['w_gate']}", (2 * self.shapes.ffn, self.shapes.hidden),
                              index=gate_up_index(self.shapes.ffn))
        if layer is None or base not in FUSED:
            return super().static_tensor(arg, layer, lm_source)
        hf, shape, first, rows = self._fused_rows(base)
        order = self._rotary_index(base, rows) or tuple(range(rows))
        return TensorSpec(f"model.layers.{layer}.{hf}", shape, index=tuple(first + r for r in order))


def phi3_options(cfg: dict, path: Path) -> dict:
    """partial_rotary_factor (top level, or in rope_parameters) -> rotary_dim; sliding_window."""
    params = cfg.get("rope_parameters") if isinstance(cfg.get("rope_parameters"), dict) else {}
    factor = params.get("partial_rotary_factor", cfg.get("partial_rotary_factor", 1.0))
    if not isinstance(factor, (int, float)) or not 0 < factor <= 1:
        raise UnsupportedModel(f"{path}: partial_rotary_factor must be in (0, 1], got {factor!r}")
    hidden, heads = cfg.get("hidden_size"), cfg.get("num_attention_heads")
    head_dim = cfg.get("head_dim") or (hidden // heads if isinstance(hidden, int) and isinstance(heads, int)
                                       and heads > 0 else 0)
    rot = int(head_dim * factor)
    if rot <= 0 or rot % 2:
        raise UnsupportedModel(f"{path}: partial_rotary_factor {factor} gives {rot} rotary dims of head_dim "
                               f"{head_dim}: must be a positive even number")
    return {**sliding_window_option(cfg, path), **({"rotary_dim": rot} if rot != head_dim else {})}


FAMILY = Family("Phi3ForCausalLM", "phi3", Phi3Model,
                "fused qkv_proj / gate_up_proj split at load; partial rotary (q/k rows reordered, RoPE table "
                "rotates the rest by 0); longrope; sliding_window as Mistral", phi3_options,
                honours_sliding_window=True)
