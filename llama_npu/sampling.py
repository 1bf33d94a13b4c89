"""Next-token selection: greedy by default; temperature / top-k / top-p with a seeded numpy Generator.

All functions are pure (the Generator is the only state) and operate on f32 logits [vocab].
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


def greedy(logits: np.ndarray) -> int:
    """argmax; ties go to the smaller id (np.argmax returns the first maximum)."""
    return int(np.argmax(logits))


def filter_top_k(logits: np.ndarray, k: int) -> np.ndarray:
    """Keep the k largest logits (ties at the k-th value are kept), others -> -inf."""
    if k <= 0 or k >= logits.size:
        return logits
    kth = np.partition(logits, -k)[-k]
    return np.where(logits >= kth, logits, -np.inf)


def softmax(logits: np.ndarray) -> np.ndarray:
    z = logits.astype(np.float64) - np.max(logits)
    p = np.exp(z)
    return p / p.sum()


def filter_top_p(probs: np.ndarray, p: float) -> np.ndarray:
    """Nucleus: keep the smallest set of most likely tokens whose mass reaches p (at least one); renormalise."""
    if p >= 1.0:
        return probs
    order = np.argsort(-probs, kind="stable")
    cum = np.cumsum(probs[order])
    keep_n = int(np.searchsorted(cum, p) + 1)
    out = np.zeros_like(probs)
    kept = order[:keep_n]
    out[kept] = probs[kept]
    return out / out.sum()


def sample(logits: np.ndarray, temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0,
           rng: np.random.Generator | None = None) -> int:
    """temperature <= 0 -> greedy; otherwise softmax(logits / T) restricted by top-k then top-p."""
    logits = np.asarray(logits, dtype=np.float32)
    if temperature <= 0:
        return greedy(logits)
    if rng is None:
        rng = np.random.default_rng()
    probs = softmax(filter_top_k(logits / np.float32(temperature), top_k))
    probs = filter_top_p(probs, top_p)
    return int(rng.choice(probs.size, p=probs))


@dataclass
class Sampler:
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    rng: np.random.Generator = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        self.rng = np.random.default_rng(self.seed)

    def __call__(self, logits: np.ndarray) -> int:
        return sample(logits, self.temperature, self.top_k, self.top_p, self.rng)
