"""The `gemv_q4` kernel's tiling plan: the gemv herd (one shim stream per tile, up to 16 tiles) streaming WHOLE
q4 rows (a row of K = 14336 is 8960 bytes: no K chunking is needed at the shapes in use), tile_m rows per step,
ping-ponged; a ValueError naming the dimension and the NPU2 limit otherwise."""
from __future__ import annotations

from dataclasses import dataclass

from kernel_builder.gemv.plan import (CORE_TASK_MAX_REPEATS, MAX_GEMV_TILE_M, first_best, gemv_herd_shape,
                                      gemv_tile_counts)
from kernel_builder.gemv_q4.external import Q4_K_MULTIPLE
from kernel_builder.gemv_q4.format import Q4Layout
from kernel_builder.swiglu.external import SWIGLU_N_MULTIPLE
from kernel_builder.planner import BF16, L1_BUDGET, check_positive, divisors_desc, even_or_one, kib, pingpong_copies


@dataclass(frozen=True)
class GemvQ4Plan:
    m: int
    k: int
    group: int
    mins: int
    herd_x: int
    herd_y: int
    tile_m: int
    bits: int = 4
    bias: bool = False   # gemv_q4_bias: the tile's bias rows after x, in x's buffer
    swiglu: bool = False  # gemv_q4_swiglu: the tile streams its gate rows then its up rows (2R into y), writes R

    @property
    def stream_rows(self) -> int:
        """Weight rows on one tile's stream (and its GEMV outputs in L1): R, or R gate + R up rows."""
        return self.rows_per_tile * (1 + self.swiglu)

    @property
    def layout(self) -> Q4Layout:
        return Q4Layout(self.k, self.group, bool(self.mins), self.bits)

    @property
    def tiles(self) -> int:
        return self.herd_x * self.herd_y

    @property
    def rows_per_tile(self) -> int:
        return self.m // self.tiles

    @property
    def steps(self) -> int:
        return self.stream_rows // self.tile_m

    @property
    def core_task_repeats(self) -> int:
        return -(-self.steps // pingpong_copies(self.steps))

    def l1_buffers(self) -> dict[str, int]:
        out = {"w": pingpong_copies(self.steps) * self.tile_m * self.layout.row_bytes,
               "x": BF16 * (self.k + self.rows_per_tile * self.bias), "y": BF16 * self.stream_rows}
        return {**out, "act": BF16 * self.rows_per_tile} if self.swiglu else out

    def l1_bytes(self) -> int:
        return sum(self.l1_buffers().values())

    def stream_bytes(self) -> int:
        """Bytes on one tile's shim stream (x, then its q4 rows)."""
        return BF16 * (self.k + self.rows_per_tile * self.bias) + self.stream_rows * self.layout.row_bytes


def plan_gemv_q4(m: int, k: int, group: int, mins: int, bits: int = 4, bias: bool = False,
                 swiglu: bool = False) -> GemvQ4Plan:
    check_positive("gemv_q4", m=m, k=k)
    if k % Q4_K_MULTIPLE:
        raise ValueError(f"gemv_q4: k={k} must be a multiple of {Q4_K_MULTIPLE} (one int4 vector of 32 lanes)")
    Q4Layout(k, group, bool(mins), bits)
    counts = gemv_tile_counts("gemv_q4", m)

    def candidates(hx, hy, rows):
        if swiglu and rows % SWIGLU_N_MULTIPLE:    # the tile's SwiGLU runs on whole 32-lane vectors
            return
        for tile_m in divisors_desc(rows, MAX_GEMV_TILE_M):
            plan = GemvQ4Plan(m, k, group, int(mins), hx, hy, tile_m, bits, bias, swiglu)
            if plan.l1_bytes() <= L1_BUDGET and plan.core_task_repeats <= CORE_TASK_MAX_REPEATS:
                yield plan, (even_or_one(plan.steps), tile_m)

    best = first_best(m, counts, candidates)
    if best is not None:
        return best
    if swiglu and all((m // t) % SWIGLU_N_MULTIPLE for t in counts):
        raise ValueError(f"gemv_q4_swiglu: m={m} gives no herd whose tiles own a multiple of {SWIGLU_N_MULTIPLE} "
                         "rows (the tile's SwiGLU vector path)")
    need = GemvQ4Plan(m, k, group, int(mins), *gemv_herd_shape(counts[0]), 1, bits, bias, swiglu).l1_bytes()
    raise ValueError(f"gemv_q4: m={m}, k={k} needs {kib(need)} of L1 per tile (x and whole q4 rows); the NPU2 "
                     f"limit is {kib(L1_BUDGET)}: split m into partitions")
