"""The `dequant_q4` kernel's tiling plan: herd [tiles, 1] (tile t owns rows [t*R, (t+1)*R) of the weight), tile_m
whole q4 rows per step DMA'd in (ping-ponged) and their bf16 rows stored from one L1 buffer (the call writes it);
a ValueError naming the dimension and the NPU2 limit otherwise."""
from __future__ import annotations

from dataclasses import dataclass

from kernel_builder.dequant_q4.external import DQ4_K_MULTIPLE
from kernel_builder.gemv_q4.format import Q4Layout
from kernel_builder.planner import (BF16, L1_BUDGET, NPU2_COLS, check_positive, divisors_desc, even_or_one, kib,
                                    pingpong_copies)

MAX_OUT_BYTES = 16 * 1024    # bf16 bytes per step: past this a store's setup is amortised; L1 is left to the input


@dataclass(frozen=True)
class DequantQ4Plan:
    m: int
    k: int
    group: int
    mins: int
    tiles: int
    tile_m: int

    @property
    def layout(self) -> Q4Layout:
        return Q4Layout(self.k, self.group, bool(self.mins))

    @property
    def rows_per_tile(self) -> int:
        return self.m // self.tiles

    @property
    def steps(self) -> int:
        return self.rows_per_tile // self.tile_m

    def l1_buffers(self) -> dict[str, int]:
        return {"w": pingpong_copies(self.steps) * self.tile_m * self.layout.row_bytes,
                "y": BF16 * self.tile_m * self.k}

    def l1_bytes(self) -> int:
        return sum(self.l1_buffers().values())


def plan_dequant_q4(m: int, k: int, group: int, mins: int) -> DequantQ4Plan:
    check_positive("dequant_q4", m=m, k=k)
    if k % DQ4_K_MULTIPLE:
        raise ValueError(f"dequant_q4: k={k} must be a multiple of {DQ4_K_MULTIPLE} (one int4 vector of 32 lanes)")
    Q4Layout(k, group, bool(mins))
    for tiles in divisors_desc(m, NPU2_COLS):
        best, best_key = None, None
        for tile_m in divisors_desc(m // tiles, m // tiles):
            plan = DequantQ4Plan(m, k, group, int(mins), tiles, tile_m)
            if plan.l1_bytes() > L1_BUDGET or (tile_m > 1 and BF16 * tile_m * k > MAX_OUT_BYTES):
                continue
            key = (even_or_one(plan.steps), tile_m)
            if best_key is None or key > best_key:
                best, best_key = plan, key
        if best is not None:
            return best
    need = DequantQ4Plan(m, k, group, int(mins), 1, 1).l1_bytes()
    raise ValueError(f"dequant_q4: k={k} needs {kib(need)} of L1 per tile (a q4 row in, double-buffered, and its "
                     f"bf16 row out); the NPU2 limit is {kib(L1_BUDGET)}")
