"""The `gemv_bfp` kernel's tiling plan: the gemv plan (kernel_builder.gemv.plan.plan_gemv_rows: up to 16 tiles,
one shim stream each, x then the tile's weight bytes as one contiguous run) on weights of 9 bits streamed in
8-row block rows: each tile owns whole block rows (rows per tile a multiple of 8), a step is one or two block rows
(tile_m 8 or 16) of a K chunk that is a multiple of 8; K is chunked only with one block row per step (a block
row's K chunks are consecutive bytes of the at-rest layout, so the tile's stream stays one linear transfer)."""
from __future__ import annotations

from kernel_builder import block_float
from kernel_builder.gemv.plan import GEMV_MAX_TILES, GemvPlan, gemv_herd_shape, plan_gemv_rows
from kernel_builder.gemv_bfp.external import BFP_BLOCK
from kernel_builder.planner import check_positive, divisors_desc

BFP_W_BITS = 8 * block_float.GROUP_BYTES // block_float.BLOCK    # 9 bits per weight (8-bit mantissa + E/8)


def bfp_tile_counts(kind: str, m: int) -> list[int]:
    """Tile counts of a block-float GEMV of m rows, the most weight streams first: divisors of m/8 (whole block
    rows per tile) up to GEMV_MAX_TILES that make a herd."""
    counts = [t for t in divisors_desc(m, GEMV_MAX_TILES) if (m // t) % BFP_BLOCK == 0 and gemv_herd_shape(t)]
    if not counts:
        raise ValueError(f"{kind}: m={m} must be a multiple of {BFP_BLOCK} (whole 8-row block rows per tile)")
    return counts


def plan_gemv_bfp(m: int, k: int, bias: bool = False) -> GemvPlan:
    kind = "gemv_bfp_bias" if bias else "gemv_bfp"
    check_positive(kind, m=m, k=k)
    if k % BFP_BLOCK:
        raise ValueError(f"{kind}: k={k} must be a multiple of {BFP_BLOCK} (8x8 block-float blocks)")
    return plan_gemv_rows(kind, m, k, bias, bfp_tile_counts(kind, m), BFP_BLOCK, BFP_W_BITS, BFP_BLOCK)
