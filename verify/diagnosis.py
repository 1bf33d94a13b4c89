"""Per-layer drift lens: prefill one prompt on both sides and compare every decoder layer's output.

Informational only (never a verdict): read it to localise a regression that `make verify` flagged.
Per layer, over the prompt's rows (positions): cosine min / median between our hidden row and HF's, and
the max absolute difference, next to HF's own max |h| for scale (the residual stream grows with depth).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

DEFAULT_PROMPT = "The quick brown fox jumps over the lazy dog, and then it runs back into the forest."


@dataclass(frozen=True)
class LayerStats:
    layer: int
    cos_min: float
    cos_median: float
    max_abs: float
    ref_max_abs: float

    def to_dict(self) -> dict:
        return asdict(self)


def row_cosines(ours: np.ndarray, ref: np.ndarray) -> np.ndarray:
    """Cosine similarity of each row pair; two all-zero rows count as identical (1.0), one zero row as 0."""
    a = np.asarray(ours, dtype=np.float64)
    b = np.asarray(ref, dtype=np.float64)
    if a.shape != b.shape or a.ndim != 2:
        raise ValueError(f"hidden states must be matching [rows, hidden] arrays, got {a.shape} vs {b.shape}")
    na, nb = np.linalg.norm(a, axis=1), np.linalg.norm(b, axis=1)
    dot = np.einsum("ij,ij->i", a, b)
    with np.errstate(invalid="ignore", divide="ignore"):
        cos = dot / (na * nb)
    cos = np.where((na == 0) & (nb == 0), 1.0, cos)
    cos = np.where((na == 0) ^ (nb == 0), 0.0, cos)
    return np.where(np.isfinite(cos), cos, -1.0)  # NaN/Inf in our output is maximal drift, not a crash


def layer_stats(ours: list[np.ndarray], ref: list[np.ndarray]) -> list[LayerStats]:
    if len(ours) != len(ref):
        raise ValueError(f"our runtime returned {len(ours)} layer outputs, the reference {len(ref)}")
    out = []
    for i, (a, b) in enumerate(zip(ours, ref)):
        cos = row_cosines(a, b)
        diff = np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))
        max_abs = float(np.nanmax(np.where(np.isfinite(diff), diff, np.inf))) if diff.size else 0.0
        out.append(LayerStats(i, float(cos.min()), float(np.median(cos)), max_abs,
                              float(np.abs(b).max()) if b.size else 0.0))
    return out


def format_table(stats: list[LayerStats]) -> str:
    lines = [f"{'layer':>5}  {'cos min':>9}  {'cos median':>10}  {'max |ours-HF|':>13}  {'max |HF|':>9}",
             f"{'-' * 5}  {'-' * 9}  {'-' * 10}  {'-' * 13}  {'-' * 9}"]
    for s in stats:
        lines.append(f"{s.layer:>5}  {s.cos_min:>9.5f}  {s.cos_median:>10.5f}  {s.max_abs:>13.4g}  "
                     f"{s.ref_max_abs:>9.4g}")
    return "\n".join(lines)
