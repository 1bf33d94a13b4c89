"""RoPE LUT rows for the runtime: the prefill LUT of each bucket (static) and one row per decode
position (input), both from kernel_builder.reference.rope_lut so host and kernels agree bit-for-bit."""
from __future__ import annotations

import numpy as np

from kernel_builder.numerics import BF16
from kernel_builder.reference import rope_lut

from .config import RopeParams


class RopeTable:
    """LUT rows for positions [0, n), computed once and grown geometrically on demand."""

    def __init__(self, head_dim: int, rope: RopeParams, initial: int = 0):
        self.head_dim = head_dim
        self.rope = rope
        self._lut = np.zeros((0, head_dim), dtype=BF16)
        if initial:
            self.ensure(initial)

    def ensure(self, n: int) -> None:
        have = self._lut.shape[0]
        if n <= have:
            return
        n = max(n, 2 * have)
        extra = rope_lut(np.arange(have, n), self.head_dim, self.rope.theta, self.rope.scaling)
        self._lut = np.ascontiguousarray(np.concatenate([self._lut, extra]))

    def rows(self, n: int) -> np.ndarray:
        """[n, head_dim] bf16 for positions 0..n-1 (the prefill LUT of an n-row bucket)."""
        self.ensure(n)
        return np.ascontiguousarray(self._lut[:n])

    def row(self, pos: int) -> np.ndarray:
        """[1, head_dim] view for one decode position."""
        self.ensure(pos + 1)
        return self._lut[pos:pos + 1]
