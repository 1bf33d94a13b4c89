"""The RoPE table: one row per position, `[cos(p*f_0..f_{d/2-1}) | sin(...)]` (HF `rotate_half` layout), with
the model's frequencies (default, `linear`, `llama3` or `longrope` rope_scaling; bit-identical to HF's rotary
embedding). With partial rotary embedding (rotary_dim < head_dim, Phi-3) the first rotary_dim/2 pairs carry the
angles and the rest angle 0 (cos 1, sin 0: the model description loads q/k rows in the matching order). The runtime writes it once into the device state `rope`; the rope kernel reads the rows of the
positions a call works on. The kernel layer only rotates by the cos/sin it is given."""
from __future__ import annotations

import math

import numpy as np

from kernel_builder.numerics import BF16, to_bf16

from .config import RopeParams

F32 = np.float32


def rope_inv_freq(head_dim: int, theta: float, scaling: dict | None = None) -> np.ndarray:
    """HF's inverse frequencies in float32 (LlamaRotaryEmbedding), incl. the `linear` and `llama3` rope_scaling."""
    if isinstance(head_dim, bool) or not isinstance(head_dim, (int, np.integer)) or head_dim <= 0:
        raise ValueError(f"rope_lut: head_dim must be a positive int, got {head_dim!r}")
    if head_dim % 2:
        raise ValueError(f"rope_lut: head_dim={head_dim} must be even")
    # HF: 1.0 / (base ** (arange(0, dim, 2).float() / dim)), all float32 tensors.
    exponent = np.arange(0, head_dim, 2, dtype=np.int64).astype(F32) / F32(head_dim)
    inv_freq = F32(1.0) / np.power(F32(theta), exponent, dtype=F32)
    rope_type = None
    if scaling:
        rope_type = scaling.get("rope_type", scaling.get("type"))
    if rope_type in (None, "default"):
        return inv_freq
    if rope_type == "linear":
        return inv_freq / F32(scaling["factor"])
    if rope_type == "llama3":
        return _llama3_inv_freq(inv_freq, scaling)
    if rope_type == "longrope":   # the short factors; rope_lut switches to the long ones past the original context
        return _longrope_inv_freq(head_dim, theta, scaling["short_factor"])
    raise ValueError(f"rope_lut: unsupported rope_scaling type {rope_type!r} (supported: default, linear, llama3)")


def _llama3_inv_freq(inv_freq: np.ndarray, scaling: dict) -> np.ndarray:
    # Same expressions and float32 evaluation order as transformers' _compute_llama3_parameters.
    try:
        factor = scaling["factor"]
        low_freq_factor = scaling["low_freq_factor"]
        high_freq_factor = scaling["high_freq_factor"]
        old_context_len = scaling["original_max_position_embeddings"]
    except KeyError as e:
        raise ValueError(f"rope_lut: llama3 rope_scaling is missing {e.args[0]!r}") from None
    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor
    wavelen = F32(2 * math.pi) / inv_freq
    inv_freq_llama = np.where(wavelen > low_freq_wavelen, inv_freq / F32(factor), inv_freq)
    smooth_factor = (F32(old_context_len) / wavelen - F32(low_freq_factor)) / F32(high_freq_factor - low_freq_factor)
    smoothed = (F32(1) - smooth_factor) * inv_freq_llama / F32(factor) + smooth_factor * inv_freq_llama
    is_medium = ~(wavelen < high_freq_wavelen) & ~(wavelen > low_freq_wavelen)
    return np.where(is_medium, smoothed, inv_freq_llama).astype(F32, copy=False)


def _longrope_inv_freq(dim: int, theta: float, factors) -> np.ndarray:
    # transformers' _compute_longrope_parameters: 1.0 / (ext_factors * base ** (arange(0, dim, 2).float() / dim))
    exponent = np.arange(0, dim, 2, dtype=np.int64).astype(F32) / F32(dim)
    ext = np.asarray(factors, dtype=F32)
    if ext.shape != exponent.shape:
        raise ValueError(f"rope_lut: longrope factors have {ext.size} entries, rotary dims / 2 = {exponent.size}")
    return F32(1.0) / (ext * np.power(F32(theta), exponent, dtype=F32))


def rope_lut(positions: np.ndarray, head_dim: int, theta: float, scaling: dict | None = None,
             rotary_dim: int = 0) -> np.ndarray:
    """LUT rows [cos(p*f) | sin(p*f)] (half-split layout) as bf16[len(positions), head_dim].

    Angles in float32 like HF (position.float() * inv_freq), cos/sin in float32 (times longrope's attention
    factor), then bf16 RNE. `rotary_dim` (< head_dim): frequencies over rotary_dim, the other pairs angle 0.
    longrope: positions below original_max_position_embeddings use the short factors, the others the long ones
    (HF picks by the highest position of a call: the same for every decode step)."""
    positions = np.asarray(positions)
    if positions.ndim != 1:
        raise ValueError(f"rope_lut: positions must be 1-D, got shape {positions.shape}")
    if positions.size and (positions.min() < 0 or not np.issubdtype(positions.dtype, np.integer)):
        raise ValueError("rope_lut: positions must be non-negative integers")
    rot = rotary_dim or head_dim
    freqs = positions.astype(F32)[:, None] * rope_inv_freq(rot, theta, scaling)[None, :]
    att = F32(1.0)
    if scaling and scaling.get("rope_type") == "longrope":
        long = positions >= scaling["original_max_position_embeddings"]
        if long.any():
            freqs[long] = positions[long].astype(F32)[:, None] * _longrope_inv_freq(rot, theta,
                                                                                    scaling["long_factor"])[None, :]
        att = F32(scaling["attention_factor"])
    cos, sin = np.cos(freqs) * att, np.sin(freqs) * att
    if rot < head_dim:
        rest = (positions.size, (head_dim - rot) // 2)
        cos = np.concatenate([cos, np.ones(rest, F32)], axis=1)
        sin = np.concatenate([sin, np.zeros(rest, F32)], axis=1)
    return to_bf16(np.concatenate([cos, sin], axis=1))


class RopeTable:
    """LUT rows for positions [0, n), computed once and grown geometrically on demand."""

    def __init__(self, head_dim: int, rope: RopeParams, initial: int = 0, rotary_dim: int = 0):
        self.head_dim = head_dim
        self.rope = rope
        self.rotary_dim = rotary_dim
        self._lut = np.zeros((0, head_dim), dtype=BF16)
        if initial:
            self.ensure(initial)

    def ensure(self, n: int) -> None:
        have = self._lut.shape[0]
        if n <= have:
            return
        n = max(n, 2 * have)
        extra = rope_lut(np.arange(have, n), self.head_dim, self.rope.theta, self.rope.scaling, self.rotary_dim)
        self._lut = np.ascontiguousarray(np.concatenate([self._lut, extra]))

    def rows(self, n: int) -> np.ndarray:
        """[n, head_dim] bf16 for positions 0..n-1 (the prefill LUT of an n-row bucket)."""
        self.ensure(n)
        return np.ascontiguousarray(self._lut[:n])

    def row(self, pos: int) -> np.ndarray:
        """[1, head_dim] view for one decode position."""
        self.ensure(pos + 1)
        return self._lut[pos:pos + 1]
