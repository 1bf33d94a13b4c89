"""The `kv_dequant` kernel's tiling plan: herd [tiles, 1], tile t owns rows [t*R, (t+1)*R) of the window; per step
tile_m KV8 rows in (codes and scales, ping-ponged), their bf16 K and V rows out (written by the call)."""
from __future__ import annotations

from kernel_builder.kv_dequant.external import KVD_HEAD_DIM_MULTIPLE
from kernel_builder.kv_quant.plan import KvQuantPlan, first_fit
from kernel_builder.planner import BF16, L1_BUDGET, check_positive, kib, pingpong_copies

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
    p = first_fit(KvDequantPlan, rows, kv_heads, head_dim, MAX_STEP_BYTES)   # codes, scales in; k, v out
    if p:
        return p
    raise ValueError(f"kv_dequant: a row of {width} values needs {kib(8 * width)} of L1 per tile; the NPU2 limit "
                     f"is {kib(L1_BUDGET)}")
