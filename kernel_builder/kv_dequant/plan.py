"""The `kv_dequant` kernel's tiling plan: herd [tiles, 1], tile t owns rows [t*R, (t+1)*R) of the window; per step
tile_m KV8 rows in (codes and scales, ping-ponged), their bf16 K and V rows out (written by the call)."""
from __future__ import annotations

from kernel_builder.kv_dequant.external import KVD_HEAD_DIM_MULTIPLE
from kernel_builder.kv_quant.plan import KvQuantPlan
from kernel_builder.planner import BF16, L1_BUDGET, NPU2_COLS, check_positive, divisors_desc, kib, pingpong_copies

MAX_STEP_BYTES = 8 * 1024    # bf16 output bytes per step (K and V each)


class KvDequantPlan(KvQuantPlan):
    """kv_quant's plan (rows, kv heads, head_dim, tiles, rows per step) with the reverse buffers: KV8 rows in,
    bf16 K and V rows out."""

    def l1_buffers(self) -> dict[str, int]:
        n = pingpong_copies(self.steps) * self.tile_m
        return {"kv": n * (2 * self.width + 8 * self.kv_heads),
                "k": BF16 * self.tile_m * self.width, "v": BF16 * self.tile_m * self.width}


def plan_kv_dequant(rows: int, kv_heads: int, head_dim: int) -> KvDequantPlan:
    check_positive("kv_dequant", rows=rows, kv_heads=kv_heads, head_dim=head_dim)
    if head_dim % KVD_HEAD_DIM_MULTIPLE:
        raise ValueError(f"kv_dequant: head_dim={head_dim} must be a multiple of {KVD_HEAD_DIM_MULTIPLE}")
    width = kv_heads * head_dim
    for tiles in divisors_desc(rows, NPU2_COLS):   # one shim column per tile: codes, scales in; k, v out
        for tm in divisors_desc(rows // tiles, max(1, MAX_STEP_BYTES // (BF16 * width))):
            p = KvDequantPlan(rows, kv_heads, head_dim, tiles, tm)
            if p.l1_bytes() <= L1_BUDGET:
                return p
    raise ValueError(f"kv_dequant: a row of {width} values needs {kib(8 * width)} of L1 per tile; the NPU2 limit "
                     f"is {kib(L1_BUDGET)}")
