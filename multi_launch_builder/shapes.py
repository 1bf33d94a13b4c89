"""Model shapes the kernel layer needs, independent of how the model was loaded."""
from __future__ import annotations

from dataclasses import dataclass


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
SMOLLM2_135M = ModelShapes(hidden=576, n_heads=9, n_kv_heads=3, head_dim=64, ffn=1536,
                           vocab=49152, n_layers=30, rms_eps=1e-5)
