"""The NPU2 hardware model (kernel_builder/hw) on hand-written AIR modules, streams and DMA transfers: shim and
core channels, fan-in, broadcast, packet flows, and the transfer rules of a DMA (width, dimensions, affine
offsets) (docs/hardware-model.md)."""
from __future__ import annotations

from kernel_builder.hw import NPU2, analyze_module
from kernel_builder.presets import AirccPreset
from tests.hw_texts import herd_module, resources

def test_32_cores_storing_to_l3_exceed_shim_s2mm_channels():
    body = """
          %out = memref.alloc() : memref<8x64xbf16, 2 : i32>
          %r = arith.muli %tx, %c8 : index
          %c_ = arith.muli %ty, %c64 : index
          air.dma_memcpy_nd (%a0[%r, %c_] [%c8, %c64] [%c256, %c1_], %out[] [] []) : (memref<64x256xbf16>, memref<8x64xbf16, 2 : i32>)"""
    rep = analyze_module(herd_module(body, "memref<64x256xbf16>"), "gemm_like")
    assert rep.resources() == {"shim S2MM channels"}
    assert rep.usage.shim_s2mm == 32 and NPU2.shim_s2mm_total == 16
    line = rep.first_violation()
    assert line.startswith("gemm_like: launch 0") and "shim S2MM channels 32/16" in line and "\n" not in line
    # the same stores from an [8, 2] herd fit: 16 streams
    assert resources(herd_module(body, "memref<64x256xbf16>", sizes=(8, 2))) == set()


def test_two_byte_dma_is_rejected_on_both_sides():
    body = """
          %y = memref.alloc() : memref<1xbf16, 2 : i32>
          air.dma_memcpy_nd (%a0[%c0, %tx] [%c1_, %c1_] [%c64, %c1_], %y[] [] []) : (memref<1x64xbf16>, memref<1xbf16, 2 : i32>)"""
    rep = analyze_module(herd_module(body, "memref<1x64xbf16>", sizes=(8, 1)))
    assert {"core DMA transfer bytes", "shim DMA transfer bytes"} <= rep.resources()
    assert "DMA transfer bytes (2; needs multiple of 4)" in rep.first_violation()
    # two bf16 (4 bytes) is one 32-bit word: fine
    ok = body.replace("memref<1xbf16, 2 : i32>", "memref<2xbf16, 2 : i32>").replace("[%c1_, %c1_]", "[%c1_, %c2]")
    ok = ok.replace("%tx] [", "%r2] [").replace("%y = memref", "%r2 = arith.muli %tx, %c2 : index\n          %y = memref")
    assert resources(herd_module(ok, "memref<1x64xbf16>", sizes=(8, 1))) == set()


def test_access_beyond_four_dims_on_the_shim_is_a_rule_violation():
    # airrt lowering keeps the innermost 4 dims of a DDR access: a 6-D pattern compiles and moves less data
    outer = """
        %cc0 = arith.constant 0 : index
        %cc1 = arith.constant 1 : index
        %cc2 = arith.constant 2 : index
        %cc4 = arith.constant 4 : index
        %cc5 = arith.constant 5 : index
        %cc64 = arith.constant 64 : index
        %cc128 = arith.constant 128 : index
        %s1 = arith.constant 512 : index
        %s2 = arith.constant 2048 : index
        %s3 = arith.constant 8192 : index
        %s4 = arith.constant 65536 : index
        %buf = memref.alloc() : memref<5x4x2x2x2x64xbf16, 1 : i32>
        air.dma_memcpy_nd (%buf[] [] [], %s0[%cc0, %cc0, %cc0, %cc0, %cc0, %cc0] [%cc5, %cc4, %cc2, %cc2, %cc2, %cc64] [%s4, %s3, %s2, %s1, %cc128, %cc1]) : (memref<5x4x2x2x2x64xbf16, 1 : i32>, memref<655360xbf16>)
        memref.dealloc %buf : memref<5x4x2x2x2x64xbf16, 1 : i32>"""
    rep = analyze_module(herd_module("", "memref<655360xbf16>", sizes=(1, 1), outer=outer))
    assert rep.resources() == {"shim BD dimensions"} and rep.violations[0].kind == "rule"
    assert "shim BD dimensions 6/4" in rep.first_violation()


def test_non_affine_dma_offset_in_a_loop():
    body = """
          %first = arith.muli %tx, %c64 : index
          scf.for %i = %c0 to %c64 step %c1_ {
            %g = arith.addi %first, %i : index
            %off = arith.muli %g, %c256 : index
            %row = arith.divui %off, %c1024 : index
            %col = arith.remui %off, %c1024 : index
            %x = memref.alloc() : memref<256xbf16, 2 : i32>
            air.dma_memcpy_nd (%x[] [] [], %a0[%row, %col] [%c1_, %c256] [%c1024, %c1_]) : (memref<256xbf16, 2 : i32>, memref<128x1024xbf16>)
            func.call @use(%x) : (memref<256xbf16, 2 : i32>) -> ()
            memref.dealloc %x : memref<256xbf16, 2 : i32>
          }"""
    rep = analyze_module(herd_module(body, "memref<128x1024xbf16>", sizes=(2, 1)))
    assert rep.resources() == {"shim DMA offset"}
    v = rep.violations[0]
    assert v.kind == "rule" and v.stage == "airrt-to-npu" and "unknown ssa offset producer" in v.detail
    # the same walk written affinely folds into one BD per tile
    affine = body.replace("%row = arith.divui %off, %c1024 : index", "%row = arith.muli %c0, %c0 : index")
    affine = affine.replace("%col = arith.remui %off, %c1024 : index", "%col = arith.addi %off, %c0 : index")
    assert resources(herd_module(affine, "memref<128x1024xbf16>", sizes=(2, 1))) == set()


def test_broadcast_loaded_once_outside_a_loop_lowers():
    # mlir-air's air-dma-to-channel handles it (PR #1489): today's GEMV x and RMSNorm weight lower
    body = """
          %v = memref.alloc() : memref<64xbf16, 2 : i32>
          air.dma_memcpy_nd (%v[] [] [], %a0[%c0] [%c64] [%c1_]) : (memref<64xbf16, 2 : i32>, memref<64xbf16>)
          scf.for %i = %c0 to %c4 step %c1_ {
            func.call @use(%v) : (memref<64xbf16, 2 : i32>) -> ()
          }"""
    assert resources(herd_module(body, "memref<64xbf16>", sizes=(8, 1))) == set()


def test_store_not_depending_on_every_tile_id_is_fan_in():
    body = """
          %out = memref.alloc() : memref<64xbf16, 2 : i32>
          air.dma_memcpy_nd (%a0[%c0] [%c64] [%c1_], %out[] [] []) : (memref<64xbf16>, memref<64xbf16, 2 : i32>)"""
    rep = analyze_module(herd_module(body, "memref<64xbf16>", sizes=(4, 1)))
    assert rep.resources() == {"shim S2MM fan-in"}
    assert "Fan-in for aie.flow isn't supported" in rep.first_violation()


def test_many_ddr_streams_per_core_become_packet_flows():
    # three per-tile loads from DDR on 8 tiles: 24 streams, but air-dma-to-channel sees a per-column pressure of
    # 3 > 2 and turns them into packet flows that share one shim channel per column and one core channel: the
    # real lowering accepts it. Nine such loads per tile need 18 locks on a core (16): rejected, as in the real
    # lowering ("lock assigned invalid id").
    def loads(n: int, sizes) -> str:
        body = "          %r = arith.muli %tx, %c64 : index\n"
        for i in range(n):
            body += (f"          %x{i} = memref.alloc() : memref<64xbf16, 2 : i32>\n"
                     f"          air.dma_memcpy_nd (%x{i}[] [] [], %a0[%r] [%c64] [%c1_]) : "
                     f"(memref<64xbf16, 2 : i32>, memref<512xbf16>)\n")
        return herd_module(body, "memref<512xbf16>", sizes=sizes)
    rep = analyze_module(loads(3, (8, 1)))
    assert rep.ok and rep.usage.core_s2mm == 1 and rep.usage.shim_mm2s == 8
    two = analyze_module(loads(2, (8, 1)))   # pressure 2: circuit-switched, 16 streams
    assert two.ok and two.usage.core_s2mm == 2 and two.usage.shim_mm2s == 16
    assert analyze_module(loads(9, (1, 2))).resources() >= {"core locks"}


def test_three_circuit_streams_into_a_core_and_soft_float_stack():
    # three loads shared by the 4 tiles (broadcast): a per-column pressure of 1 keeps them circuit-switched,
    # and a core has 2 S2MM channels
    body = """
          %q = memref.alloc() : memref<64xbf16, 2 : i32>
          %k = memref.alloc() : memref<64xbf16, 2 : i32>
          %v = memref.alloc() : memref<64xbf16, 2 : i32>
          air.dma_memcpy_nd (%q[] [] [], %a0[%c0] [%c64] [%c1_]) : (memref<64xbf16, 2 : i32>, memref<64xbf16>)
          air.dma_memcpy_nd (%k[] [] [], %a0[%c0] [%c64] [%c1_]) : (memref<64xbf16, 2 : i32>, memref<64xbf16>)
          air.dma_memcpy_nd (%v[] [] [], %a0[%c0] [%c64] [%c1_]) : (memref<64xbf16, 2 : i32>, memref<64xbf16>)
          %e = memref.load %q[%c0] : memref<64xbf16, 2 : i32>
          %f = arith.extf %e : bf16 to f32
          %d = arith.divf %f, %f : f32"""
    rep = analyze_module(herd_module(body, "memref<64xbf16>", sizes=(4, 1)))
    assert rep.resources() == {"core S2MM channels", "core stack bytes"}
    assert rep.usage.stack_need == NPU2.soft_float_div_stack_bytes
    assert analyze_module(herd_module(body, "memref<64xbf16>", sizes=(4, 1)),
                          preset=AirccPreset(stack_size=2048)).resources() == {"core S2MM channels"}
