"""The Llama family's shapes and tensor map: the dimensions a config.json gives (`ModelShapes`, with the reference
shapes of real models), the Hugging Face names of every weight a layer graph reads, and where a static argument's
bytes come from (`TensorSpec`, with the row orders of the gate/up interleave and of partial RoPE).
llama_npu.models.llama builds the layer graph and phases on them (and re-exports every name here)."""
from __future__ import annotations

from dataclasses import dataclass

from kernel_builder.gemm_swiglu.layout import PAIR, interleave_index


@dataclass(frozen=True)
class ModelShapes:
    """Every dimension a Llama-family model contributes to kernel shapes (from config.json)."""

    hidden: int          # d_model
    n_heads: int         # query heads
    n_kv_heads: int      # key/value heads (GQA)
    head_dim: int
    ffn: int             # intermediate_size
    vocab: int
    n_layers: int
    rms_eps: float
    rotary_dim: int = 0  # dims of a head RoPE rotates (partial_rotary_factor); 0 = all of head_dim

    @property
    def rot(self) -> int:
        return self.rotary_dim or self.head_dim

    @property
    def q_dim(self) -> int:
        return self.n_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.n_kv_heads * self.head_dim


# Reference shapes used by tests and benchmarks (weights are never needed for these).
LLAMA32_1B = ModelShapes(hidden=2048, n_heads=32, n_kv_heads=8, head_dim=64, ffn=8192,
                         vocab=128256, n_layers=16, rms_eps=1e-5)
LLAMA32_3B = ModelShapes(hidden=3072, n_heads=24, n_kv_heads=8, head_dim=128, ffn=8192,
                         vocab=128256, n_layers=28, rms_eps=1e-5)
LLAMA31_8B = ModelShapes(hidden=4096, n_heads=32, n_kv_heads=8, head_dim=128, ffn=14336,
                         vocab=128256, n_layers=32, rms_eps=1e-5)      # untied: embedding + LM head
SMOLLM2_135M = ModelShapes(hidden=576, n_heads=9, n_kv_heads=3, head_dim=64, ffn=1536,
                           vocab=49152, n_layers=30, rms_eps=1e-5)
REFERENCE_SHAPES = {"smollm2-135m": SMOLLM2_135M, "llama32-1b": LLAMA32_1B, "llama32-3b": LLAMA32_3B}
# Qwen3-0.6B / 1.7B config.json (per-head q/k norm: QKNormLlama)
QWEN3_0P6B = ModelShapes(hidden=1024, n_heads=16, n_kv_heads=8, head_dim=128, ffn=3072, vocab=151936, n_layers=28,
                         rms_eps=1e-6)
QWEN3_1P7B = ModelShapes(hidden=2048, n_heads=16, n_kv_heads=8, head_dim=128, ffn=6144, vocab=151936, n_layers=28,
                         rms_eps=1e-6)

# The tensor map: weight name in the graph -> Hugging Face name (per layer under `model.layers.{i}.`).
LAYER_TENSORS = {
    "attn_norm": "input_layernorm.weight",
    "wq": "self_attn.q_proj.weight",
    "wk": "self_attn.k_proj.weight",
    "wv": "self_attn.v_proj.weight",
    "wo": "self_attn.o_proj.weight",
    "ffn_norm": "post_attention_layernorm.weight",
    "w_gate": "mlp.gate_proj.weight",
    "w_up": "mlp.up_proj.weight",
    "w_down": "mlp.down_proj.weight",
}
QK_NORM_TENSORS = {"q_norm": "self_attn.q_norm.weight", "k_norm": "self_attn.k_norm.weight"}
QKV_BIAS_TENSORS = {"bq": "self_attn.q_proj.bias", "bk": "self_attn.k_proj.bias", "bv": "self_attn.v_proj.bias"}
GLOBAL_TENSORS = {"embed": "model.embed_tokens.weight", "final_norm": "model.norm.weight",
                  "lm_head": "lm_head.weight"}

GATE_UP = "w_gate_up"   # bf16: the gate and up weights as ONE static, rows interleaved by GATE_UP_PAIR
GATE_UP_PAIR = PAIR

def gate_up_index(ffn: int) -> tuple[int, ...]:
    """Rows of [gate; up] ([2 ffn, hidden]) in the GATE_UP order."""
    return tuple(int(i) for i in interleave_index(ffn))


@dataclass(frozen=True)
class TensorSpec:
    """Where a static argument's bytes come from: an HF tensor (shape as stored), or a block of its rows `[row0, row0 + rows)` zero-padded past the tensor's end (LM-head partitions)."""

    name: str
    shape: tuple[int, ...]
    row0: int = 0
    rows: int = 0
    index: tuple[int, ...] = ()    # rows gathered in this order (partial-rotary q/k layout), when set
    parts: tuple[str, ...] = ()    # HF tensors whose rows are concatenated (each `shape`) before `index` gathers


def rotary_order(head_dim: int, rotary_dim: int) -> list[int]:
    """Per head, the order of a q/k projection's output rows that puts HF's partial-rotary pairs (i, i + rd/2),
    i < rd/2, at the rope kernel's half-split pairs (j, j + hd/2) and the pass-through dims at the pairs the
    RoPE table rotates by angle 0 (cos 1, sin 0: exact). q and k get the same order, so q.k is unchanged."""
    rd, hd = rotary_dim, head_dim
    half, pas = rd // 2, (hd - rd) // 2
    return ([*range(half), *range(rd, rd + pas)] + [*range(half, rd), *range(rd + pas, hd)])
