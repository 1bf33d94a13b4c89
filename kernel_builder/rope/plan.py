"""The `rope` kernel's tiling plan (RoPE): the integers its builder needs, or a ValueError naming
the dimension and the NPU2 limit."""
from __future__ import annotations

from dataclasses import dataclass

from kernel_builder.planner import (BF16, L1_BUDGET, MAX_ELEMWISE_CHUNK, MIN_ELEMWISE_CHUNK, NPU2_COLS, check_positive,
                                    divisors_desc, even_or_one, kib, pingpong_copies, widest_herd)
from kernel_builder.rope.external import ROPE_HEAD_DIM_MULTIPLE


@dataclass(frozen=True)
class RopePlan:
    """Herd [herd, 1] split over position rows (prefill: tile t owns rows_per_tile consecutive rows, all heads)
    or over heads (decode, rows < NPU2_COLS: tile t owns heads_per_tile consecutive heads of every row). Per step
    a [step_rows, step_heads*head_dim] block of x and the step_rows LUT rows are DMA'd, one external call
    rotates them, the block is stored."""

    herd: int
    split: str              # "rows" | "heads"
    rows_per_tile: int
    heads_per_tile: int
    step_rows: int
    step_heads: int
    head_dim: int

    @property
    def steps(self) -> int:
        return (self.rows_per_tile // self.step_rows) * (self.heads_per_tile // self.step_heads)

    def l1_buffers(self) -> dict[str, int]:
        # the innermost emitted loop holds x and lut; a loop of one trip is not emitted
        inner = self.heads_per_tile // self.step_heads
        c = pingpong_copies(inner if inner > 1 else self.rows_per_tile // self.step_rows)
        block = self.step_rows * self.step_heads * self.head_dim
        return {"x": c * BF16 * block, "lut": c * BF16 * self.step_rows * self.head_dim, "y": BF16 * block}

    def l1_bytes(self) -> int:
        return sum(self.l1_buffers().values())


def plan_rope(rows: int, heads: int, head_dim: int) -> RopePlan:
    check_positive("rope", rows=rows, heads=heads, head_dim=head_dim)
    if head_dim % 2:
        raise ValueError(f"rope: head_dim={head_dim} must be even (half-split rotation)")
    if head_dim % ROPE_HEAD_DIM_MULTIPLE:
        raise ValueError(f"rope: head_dim={head_dim} must be a multiple of {ROPE_HEAD_DIM_MULTIPLE} "
                         f"(16-lane bf16 vector halves of the external kernel)")
    if rows >= NPU2_COLS:
        herd = widest_herd(rows)
        cands = [RopePlan(herd, "rows", rows // herd, heads, cr, heads, head_dim)
                 for cr in divisors_desc(rows // herd, rows // herd)]
    else:
        # decode: split the heads of each row, as many tiles as keep >= MIN_ELEMWISE_CHUNK elements per tile
        split = [h for h in divisors_desc(heads, NPU2_COLS) if (heads // h) * head_dim >= MIN_ELEMWISE_CHUNK]
        herd = split[0] if split else 1
        cands = [RopePlan(herd, "heads", rows, heads // herd, cr, heads // herd, head_dim)
                 for cr in divisors_desc(rows, rows)]
    fits = [p for p in cands if p.l1_bytes() <= L1_BUDGET
            and (p.step_rows == 1 or p.step_rows * p.step_heads * head_dim <= MAX_ELEMWISE_CHUNK)]
    if not fits:
        raise ValueError(f"rope: {heads} heads of head_dim={head_dim} need more than {kib(L1_BUDGET)} of L1 "
                         f"per tile for one row")
    return max(fits, key=lambda p: (even_or_one(p.steps), p.step_rows))
