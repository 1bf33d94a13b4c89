"""The top-k token gate: a pure comparison of two greedy decodes (no model, no I/O).

Both sides greedy-decode their OWN sequence and record, per step, the chosen token and the top-k ids of
that step's logits (step 0 = the prompt's last position). The rule walks both sequences in lockstep; at the
first step where the chosen tokens differ, each side's token must be in the other side's top-k, and that
step ends the comparison (after a divergence the two sides condition on different prefixes, so later steps
no longer compare like with like). Identical sequences pass.

A trace always includes the step that chose EOS (its token is the EOS id, its top-k comes from that
step's logits), so "one side stopped by EOS at step s while the other continued" is simply a divergence
at step s and gets the same rule. If the sequences agree up to the shorter length and the shorter one
stopped for another reason (token budget, context limit), the agreed prefix passes.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np


def topk_ids(logits, k: int) -> tuple[int, ...]:
    """The k highest logits' ids, ordered by (-logit, id): ties go to the smaller id, exactly as argmax.

    NaN ranks below every number, so a broken side cannot sneak NaN ids into its top-k ahead of real ones.
    """
    x = np.asarray(logits, dtype=np.float64).reshape(-1)
    if k < 1:
        raise ValueError(f"top-k needs k >= 1, got {k}")
    if x.size < k:
        raise ValueError(f"top-k with k={k} needs at least {k} logits, got {x.size}")
    x = np.where(np.isnan(x), -np.inf, x)
    # Partition first (vocab is large), then keep every id tied with the k-th value so the stable
    # (-logit, id) order decides among ties rather than argpartition's arbitrary pick.
    kth = np.partition(x, x.size - k)[x.size - k]
    cand = np.flatnonzero(x >= kth)
    order = np.lexsort((cand, -x[cand]))  # primary key -logit, secondary key id
    return tuple(int(i) for i in cand[order[:k]])


def greedy_token(logits) -> int:
    """The greedy choice: argmax with ties toward the smaller id (same order as topk_ids)."""
    return topk_ids(logits, 1)[0]


@dataclass
class Trace:
    """One side's greedy decode: chosen token and top-k ids per step."""

    tokens: list[int]
    topk: list[tuple[int, ...]]
    stop: str = "length"          # "eos" (last token is an EOS id), "length", or another runner-defined reason
    finite: bool = True           # False if any step's logits had NaN/Inf
    extra: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if len(self.tokens) != len(self.topk):
            raise ValueError(f"trace has {len(self.tokens)} tokens but {len(self.topk)} top-k rows")
        self.tokens = [int(t) for t in self.tokens]
        self.topk = [tuple(int(i) for i in row) for row in self.topk]

    def __len__(self) -> int:
        return len(self.tokens)


@dataclass(frozen=True)
class Verdict:
    passed: bool
    steps_compared: int
    divergence_step: int | None = None
    ours_token: int | None = None
    ref_token: int | None = None
    ours_in_ref_topk: bool | None = None
    ref_in_ours_topk: bool | None = None
    reason: str = ""

    def to_dict(self) -> dict:
        return asdict(self)


def compare(ours: Trace, ref: Trace) -> Verdict:
    """Apply the gate to one prompt: `ours` (our runtime) vs `ref` (HF transformers)."""
    if not ours.finite or not ref.finite:
        side = "ours" if not ours.finite else "reference"
        return Verdict(False, 0, reason=f"{side} produced non-finite logits")
    n = min(len(ours), len(ref))
    if n == 0:
        return Verdict(False, 0, reason="a side produced no steps to compare")
    for s in range(n):
        a, b = ours.tokens[s], ref.tokens[s]
        if a == b:
            continue
        a_in_b = a in ref.topk[s]
        b_in_a = b in ours.topk[s]
        ok = a_in_b and b_in_a
        if ok:
            reason = f"diverged at step {s} within mutual top-{_k(ours, ref, s)} (drift)"
        else:
            missing = []
            if not a_in_b:
                missing.append(f"our token {a} not in reference top-k")
            if not b_in_a:
                missing.append(f"reference token {b} not in our top-k")
            reason = f"diverged at step {s}: " + "; ".join(missing)
        return Verdict(ok, s + 1, s, a, b, a_in_b, b_in_a, reason)
    if len(ours) == len(ref):
        return Verdict(True, n, reason="identical sequences")
    shorter = "ours" if len(ours) < len(ref) else "reference"
    stop = (ours if len(ours) < len(ref) else ref).stop
    return Verdict(True, n, reason=f"identical for {n} steps; {shorter} stopped ({stop})")


def _k(ours: Trace, ref: Trace, s: int) -> int:
    return min(len(ours.topk[s]), len(ref.topk[s]))
