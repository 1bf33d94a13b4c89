"""The NPU2 hardware model (kernel_builder/hw) on hand-written AIR modules, memory tiles: an L2 buffer too large
for one, buffers dealt round robin over them, and the valid staging patterns (L2-staged broadcast, L2 drain)
that pass (docs/hardware-model.md)."""
from __future__ import annotations

from kernel_builder.hw import NPU2, analyze_module
from tests.hw_texts import herd_module, staged_gemm

def test_l2_buffer_larger_than_a_memory_tile():
    outer = """
        %cc0 = arith.constant 0 : index
        %big = memref.alloc() : memref<327680xbf16, 1 : i32>
        air.dma_memcpy_nd (%big[] [] [], %s0[] [] []) : (memref<327680xbf16, 1 : i32>, memref<327680xbf16>)
        memref.dealloc %big : memref<327680xbf16, 1 : i32>"""
    rep = analyze_module(herd_module("", "memref<327680xbf16>", sizes=(1, 1), outer=outer))
    assert rep.resources() == {"memtile L2 bytes"}
    assert rep.usage.l2_bytes == 655360 > NPU2.memtile_bytes
    assert "memtile L2 bytes 655360/524288" in rep.first_violation()


def _l2_fan_in(inbound: list[int]) -> str:
    """One L2 buffer per entry, in program order, each filled by that many L3 -> L2 DMAs (S2MM streams)."""
    lines = ["%cc0 = arith.constant 0 : index", "%cc8 = arith.constant 8 : index",
             "%cc1 = arith.constant 1 : index"]
    for i, n in enumerate(inbound):
        lines.append(f"%b{i} = memref.alloc() : memref<{8 * n}xbf16, 1 : i32>")
        for j in range(n):
            lines.append(f"%o{i}_{j} = arith.constant {8 * j} : index")
            lines.append(f"air.dma_memcpy_nd (%b{i}[%o{i}_{j}] [%cc8] [%cc1], %s0[%cc0] [%cc8] [%cc1]) : "
                         f"(memref<{8 * n}xbf16, 1 : i32>, memref<64xbf16>)")
    return "\n        ".join(lines)


def test_l2_buffers_are_dealt_round_robin_over_the_memory_tiles():
    """AIR places L2 buffers round-robin in program order (AIRToAIEPass.cpp L2MemrefToMemTileMap), not by
    packing: two 4-stream buffers eight apart land on the same memory tile (8 S2MM > 6), the same buffers in
    another order fit."""
    bad = [4] + [1] * 7 + [4]        # buffers 0 and 8 share memory tile 0
    rep = analyze_module(herd_module("", "memref<64xbf16>", sizes=(1, 1), outer=_l2_fan_in(bad)))
    assert rep.resources() == {"memtile S2MM channels"}
    assert "memtile S2MM channels 8/6" in rep.first_violation() and "memory tile 0 gets %b0, %b8" in \
        rep.first_violation()
    good = [4, 4] + [1] * 7          # memory tiles 0 and 1 get 4 + 1
    ok = analyze_module(herd_module("", "memref<64xbf16>", sizes=(1, 1), outer=_l2_fan_in(good)))
    assert ok.ok, ok.first_violation()
    assert ok.usage.memtiles == 8 and ok.usage.memtile_s2mm == 15


def test_l2_staged_broadcast_and_l2_drain_pass():
    rep = analyze_module(staged_gemm(drain=True), "staged")
    assert rep.ok, rep.first_violation()
    u = rep.usage
    assert u.shim_mm2s == 2 and u.shim_s2mm == 1          # A and B panels in, one C write out
    assert u.core_s2mm == 2 and u.core_mm2s == 1
    assert u.memtile_s2mm == 2 + 32 and u.memtile_mm2s == 2 + 1
    assert u.memtiles <= NPU2.memtiles


def test_l2_staged_broadcast_with_per_core_stores_fails_on_the_stores_only():
    rep = analyze_module(staged_gemm(drain=False), "staged")
    assert rep.resources() == {"shim S2MM channels"}


def test_broadcast_load_counts_once_per_source():
    # x broadcast from L3 to the 8 tiles (no tile id in its access) is one shim MM2S; per-tile rows are 8
    body = """
          %x = memref.alloc() : memref<64xbf16, 2 : i32>
          %w = memref.alloc() : memref<64xbf16, 2 : i32>
          %r = arith.muli %tx, %c64 : index
          air.dma_memcpy_nd (%x[] [] [], %a0[%c0] [%c64] [%c1_]) : (memref<64xbf16, 2 : i32>, memref<512xbf16>)
          air.dma_memcpy_nd (%w[] [] [], %a0[%r] [%c64] [%c1_]) : (memref<64xbf16, 2 : i32>, memref<512xbf16>)"""
    assert analyze_module(herd_module(body, "memref<512xbf16>", sizes=(8, 1))).usage.shim_mm2s == 1 + 8
