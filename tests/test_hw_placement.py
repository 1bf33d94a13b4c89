"""The hardware model's memory-tile placement (kernel_builder/hw/placement.py: mlir-air AIRToAIEPass.cpp
L2MemrefToMemTileMap's buckets, round-robin and column-affinity swaps) and the module the real lowering rejected
for it: a GEMM whose W panel is filled by two L3 DMAs (the former gemm_swiglu: gate rows, up rows). air-to-aie put
herd row i's A panel and C row panel on column i's memory tile, so a two-load W panel shares a tile with them:
1 + 2 + 4 = 7 S2MM > 6, aie-create-pathfinder-flows "targets same dst as another connect op"
(mlir-air efeb41ce4 + mlir-aie ae8ed9d). The one-load panel of the interleaved gate/up weight passes."""
from __future__ import annotations

import itertools
import re

from kernel_builder.gemm.plan import GemmPlan, _gemm_fits
from kernel_builder.hw import analyze_module
from kernel_builder.hw.placement import Bucket, channel_columns, place
from kernel_builder.registry import kernel_text

W_LOAD = re.compile(r"air\.dma_memcpy_nd \((%w_l2\w*)\[\] \[\] \[\], (%\w+)\[(%\w+), (%\w+)\] \[(%\w+), (%\w+)\] "
                    r"\[(%\w+), (%\w+)\]\) : \(([^)]*)\)")


def _two_load_w_panels(text: str, rows: int) -> str:
    """Each W panel's one L3 DMA split into two DMAs of rows/2 rows (one into each half of the panel): the
    resources of the former gemm_swiglu's gate and up loads."""
    ids = itertools.count()

    def split(m: re.Match) -> str:
        dst, src, r0, kp, _, k2, st, one, types = m.groups()
        i = next(ids)
        h, z = f"%half{i}", f"%zero{i}"
        half = (f"{h} = arith.constant {rows // 2} : index\n          {z} = arith.constant 0 : index\n          ")
        dma = (lambda off: f"air.dma_memcpy_nd ({dst}[{off}, {z}] [{h}, {k2}] [{k2}, {one}], "
                           f"{src}[{r0}, {kp}] [{h}, {k2}] [{st}, {one}]) : ({types})")
        return half + dma(z) + "\n          " + dma(h)

    out, n = W_LOAD.subn(split, text)
    assert n >= 4, "the W panel loads of the builder changed shape; update the mutation"
    return out


def test_column_affinity_puts_a_and_c_panels_on_their_column():
    """8 A panels (column i), 4 W panels (no column), 8 C row panels (column i) in allocation order: round-robin
    alone puts C_i on tile (i + 4) % 8; the swaps move every A_i and C_i to tile i, the W panels on tiles 0-3."""
    buckets = ([Bucket(1000, i) for i in range(8)] + [Bucket(1000)] * 4 + [Bucket(1000, i) for i in range(8)])
    tiles = place(buckets, 8, 512 * 1024)
    assert tiles[:8] == list(range(8)) and tiles[12:] == list(range(8))
    assert sorted(tiles[8:12]) == [0, 1, 2, 3]
    # no room for the swap: a bucket stays where round-robin put it
    assert place([Bucket(10), Bucket(400 * 1024, 0), Bucket(200 * 1024, 0)], 2, 512 * 1024) == [0, 1, 0]
    # a broadcast along the columns reaches every column; a per-column index one
    assert channel_columns((8, 1), (8, 4), (3, 0)) == {3}
    assert channel_columns((1, 4), (8, 4), (0, 2)) == set(range(8))
    assert channel_columns((8, 4), None, (5, 1)) == {5}


def test_two_load_w_panel_is_rejected_one_load_accepted():
    good = kernel_text("gemm_swiglu", 64, 576, 1536)
    assert analyze_module(good).ok
    bad = _two_load_w_panels(good, 128)
    rep = analyze_module(bad)
    assert not rep.ok and rep.resources() == {"memtile S2MM channels"}, rep.first_violation()
    v = rep.first_violation()
    assert "7/6" in v and "%a_l2" in v and "%w_l2" in v and "%c_l2" in v
    # the planner counts the same placement: a two-part W panel does not fit, one part does
    two = GemmPlan(8, 64, 128, 8, 4, 192, 576, w_parts=2, epilogue="swiglu")
    assert two.memtile_channels() == (7, 3) and not _gemm_fits(two, 576)
    one = GemmPlan(8, 64, 128, 8, 4, 192, 576, epilogue="swiglu")
    assert one.memtile_channels() == (6, 3) and _gemm_fits(one, 576)
