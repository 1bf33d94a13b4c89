"""Logits processors (mlx-lm's shape: `processor(tokens, logits) -> logits`, `tokens` = the ids generated so
far) for the OpenAI sampling fields, and the log-probabilities the API reports.

- presence / frequency penalty (OpenAI's definition): logit[j] -= frequency * count[j] + presence * (count[j] > 0),
  over the tokens generated in this reply;
- logit_bias: {token id: bias in [-100, 100]} added to the logits (-100 effectively bans a token).

All vectorised over the vocabulary; per step the Python work is O(new tokens).
"""
from __future__ import annotations

import numpy as np


class Penalties:
    def __init__(self, vocab: int, presence: float = 0.0, frequency: float = 0.0):
        self.presence, self.frequency = float(presence), float(frequency)
        self.counts = np.zeros(vocab, dtype=np.float32)
        self.seen = 0

    def __call__(self, tokens: list[int], logits: np.ndarray) -> np.ndarray:
        for t in tokens[self.seen:]:
            self.counts[t] += 1
        self.seen = len(tokens)
        if not self.seen:
            return logits
        return logits - (self.frequency * self.counts + self.presence * (self.counts > 0)).astype(np.float32)


class LogitBias:
    def __init__(self, vocab: int, bias: dict[int, float]):
        self.delta = np.zeros(vocab, dtype=np.float32)
        for t, b in bias.items():
            self.delta[t] = b

    def __call__(self, tokens: list[int], logits: np.ndarray) -> np.ndarray:
        return logits + self.delta


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """log p over the vocabulary (float64 accumulation; -inf logits stay -inf)."""
    z = logits.astype(np.float64)
    m = np.max(z)
    return (z - (m + np.log(np.sum(np.exp(z - m))))).astype(np.float32)


def top_k(logprobs: np.ndarray, k: int) -> list[tuple[int, float]]:
    """The k most likely (token, logprob), most likely first (ties: smaller id first); impossible tokens
    (-inf: masked by a grammar or a bias) are left out, so fewer than k may come back."""
    if k <= 0:
        return []
    k = min(k, logprobs.size)
    idx = np.argpartition(-logprobs, k - 1)[:k]
    idx = idx[np.lexsort((idx, -logprobs[idx]))]
    return [(int(i), float(logprobs[i])) for i in idx if np.isfinite(logprobs[i])]
