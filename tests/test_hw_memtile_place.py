"""The hardware model places L2 buffers on memory tiles as air-to-aie does (kernel_builder/hw/memtile_place.py,
mlir-air efeb41ce4 AIRToAIEPass.cpp L2MemrefToMemTileMap): buckets by shared channel, round robin in allocation
order, then column-affinity swaps. The expected placements are what the real lowering printed (aie.buffer ops of
aie.<module>.mlir, mlir-air efeb41ce4 + mlir-aie ae8ed9d, 2026-11-26)."""
from __future__ import annotations

from dataclasses import replace
from unittest import mock

import pytest

from kernel_builder.gemm import builder as gemm_builder
from kernel_builder.gemm import plan as gp
from kernel_builder.hw import analyze_module
from kernel_builder.hw.memtile_place import Bucket, affinity, place
from kernel_builder.registry import kernel_text

KiB = 1024


def test_round_robin_then_affinity_swaps():
    # a0..a7 (col i), w0..w3 (no column), c0..c7 (col i): round robin puts c0 on tile 4; c0 swaps with w0 (not on
    # an affinity tile), c4 (now on tile 0) swaps back with w0 on tile 4: every a_i / c_i ends on tile i, w_j on j
    bs = ([Bucket(f"a{i}", 64 * KiB, i) for i in range(8)] + [Bucket(f"w{j}", 64 * KiB) for j in range(4)]
          + [Bucket(f"c{i}", 16 * KiB, i) for i in range(8)])
    where = place(bs, 8, 512 * KiB)
    assert where == list(range(8)) + [0, 1, 2, 3] + list(range(8))
    assert affinity([3, 3]) == 3 and affinity([0, 1]) is None and affinity([]) is None


def test_swap_needs_room_by_the_passes_arithmetic():
    # the pass credits i's tile size(j) - size(i): a swap that would leave it "negative" does not happen
    bs = [Bucket("x", 100, None), Bucket("big", 50, 0)]
    assert place(bs, 2, 1000) == [1, 0]          # big (col 0) swaps onto tile 0
    # tiles of 120 bytes: x's tile has 20 free and is "credited" 50 - 100 by the pass (though it would then hold
    # only big's 50 bytes): no swap
    assert place(bs, 2, 120) == [0, 1]
    # a bucket already home is never displaced; count per tile is kept
    bs = [Bucket("a", 10, 0), Bucket("b", 10, 0)]
    assert place(bs, 2, 1000) == [0, 1]


def test_gemm_placement_is_the_real_lowerings():
    # gemm 64x576x576 (8x4 herd): the tool put an 8x192 A panel (3 copies) and the 8x192 C row panel on every memory
    # tile and the four 48x192 W panels (3 copies) on tiles 0-3
    rep = analyze_module(kernel_text("gemm", 64, 576, 576))
    assert rep.ok, rep.first_violation()
    tiles = rep.launches[0].work.l2_placement
    suffix = ["", "_1", "_2", "_3", "_4", "_5", "_6", "_7"]
    assert tiles == [[f"%a_l2{s}", f"%w_l2{s}", f"%c_l2{s}"] if i < 4 else [f"%a_l2{s}", f"%c_l2{s}"]
                     for i, s in enumerate(suffix)]


def _two_load_w_gemm(m: int, k: int, n: int) -> str:
    """A deliberately broken GEMM: the planner's streamed 8x4 plan with each W panel filled by two L3 DMAs."""
    with mock.patch.object(gp, "A_RESIDENT", False):
        p = replace(gp.plan_gemm(m, k, n), w_parts=2)
    with mock.patch.object(gp, "plan_gemm", lambda *a, **kw: p):
        return gemm_builder.build(m, k, n)


def test_two_load_w_panel_is_rejected_on_memory_tile_0():
    # the real lowering: FAIL route/aie-create-pathfinder-flows: "... on TileID(0, 1) targets same dst as another
    # connect op" (A panel 0 + W panel 0 with 2 loads + C row panel 0 with 4 drains = 7 S2MM)
    rep = analyze_module(_two_load_w_gemm(64, 576, 576))
    assert not rep.ok
    v = rep.violations[0]
    assert (v.tile, v.resource, v.used, v.available) == ("memtile", "S2MM channels", 7, 6)
    assert "memory tile 0 gets %a_l2, %w_l2, %c_l2" in v.detail


@pytest.mark.parametrize("shape,tiling", [((64, 576, 1536), ()), ((2048, 2048, 8192), (2, 2))])
def test_gemm_swiglu(shape, tiling):
    # gemm_swiglu reads one weight with gate and up rows interleaved by 8 (one W load per panel): it fits on the
    # 4-column herd (64 rows) and on the 8x4 herd (2048 rows, runtime loop tiling 2,2), as the real lowering says
    # (tests/test_air_lower_gemm.py); the two-load W panel it had before is the broken GEMM above
    from kernel_builder.presets import AirccPreset
    rep = analyze_module(kernel_text("gemm_swiglu", *shape), preset=AirccPreset(runtime_loop_tiling_sizes=tiling))
    assert rep.ok, rep.first_violation()
