"""The `kv_quant` kernel's tiling plan: herd [tiles, 1], tile t owns rows [t*R, (t+1)*R) of the call; per step
tile_m rows of x in (ping-ponged), their codes and scales out (one L1 buffer each, written by the call)."""
from __future__ import annotations

from dataclasses import dataclass

from kernel_builder.kv_quant.external import KVQ_HEAD_DIM_MULTIPLE
from kernel_builder.kv_quant.reference import SCALE_BYTES
from kernel_builder.planner import BF16, L1_BUDGET, NPU2_COLS, check_positive, divisors_desc, kib, pingpong_copies

MAX_STEP_BYTES = 8 * 1024    # bf16 input bytes per step


@dataclass(frozen=True)
class KvQuantPlan:
    rows: int
    kv_heads: int
    head_dim: int
    tiles: int
    tile_m: int

    @property
    def width(self) -> int:
        return self.kv_heads * self.head_dim

    @property
    def rows_per_tile(self) -> int:
        return self.rows // self.tiles

    @property
    def steps(self) -> int:
        return self.rows_per_tile // self.tile_m

    def l1_buffers(self) -> dict[str, int]:
        return {"x": pingpong_copies(self.steps) * BF16 * self.tile_m * self.width,
                "codes": self.tile_m * self.width, "scales": SCALE_BYTES * self.tile_m * self.kv_heads}

    def l1_bytes(self) -> int:
        return sum(self.l1_buffers().values())


def plan_kv_quant(rows: int, kv_heads: int, head_dim: int) -> KvQuantPlan:
    check_positive("kv_quant", rows=rows, kv_heads=kv_heads, head_dim=head_dim)
    if head_dim % KVQ_HEAD_DIM_MULTIPLE:
        raise ValueError(f"kv_quant: head_dim={head_dim} must be a multiple of {KVQ_HEAD_DIM_MULTIPLE} "
                         f"(32-lane to_fixed of the external kernel)")
    width = kv_heads * head_dim
    p = first_fit(KvQuantPlan, rows, kv_heads, head_dim, MAX_STEP_BYTES)   # x in, codes and scales out
    if p:
        return p
    raise ValueError(f"kv_quant: a row of {width} values needs {kib(5 * width)} of L1 per tile; the NPU2 limit "
                     f"is {kib(L1_BUDGET)}")


def first_fit(cls, rows: int, kv_heads: int, head_dim: int, step_bytes: int):
    """The first plan `cls(rows, kv_heads, head_dim, tiles, tile_m)` within L1: the most tiles (one shim column
    each), then the most rows per step with at most `step_bytes` bf16 bytes of a row's width; None when none
    fits (kv_quant's and kv_dequant's search)."""
    width = kv_heads * head_dim
    for tiles in divisors_desc(rows, NPU2_COLS):
        for tm in divisors_desc(rows // tiles, max(1, step_bytes // (BF16 * width))):
            p = cls(rows, kv_heads, head_dim, tiles, tm)
            if p.l1_bytes() <= L1_BUDGET:
                return p
    return None
