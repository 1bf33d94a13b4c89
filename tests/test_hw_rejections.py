"""The NPU2 hardware model (kernel_builder/hw) on hand-written AIR modules: each known rejection fails with the
right resource named, the valid staging patterns pass, and `llama-npu hw-check` reports them in one line each
(docs/hardware-model.md)."""
from __future__ import annotations

import pytest

from kernel_builder.hw import NPU2, HwParseError, analyze_module
from kernel_builder.presets import AirccPreset
from llama_npu.cli import main as cli_main


def herd_module(body: str, args: str, sizes=(8, 4), outer: str = "", channels: str = "", name: str = "t") -> str:
    """A launch > segment > herd module; `body` is the herd body, `outer` ops of the segment before the herd.
    Herd args are %a0.. bound to the func args %arg0.. in order."""
    n = args.count("memref")
    types = [t.strip() for t in args.split(";")]
    fargs = ", ".join(f"%arg{i}: {t}" for i, t in enumerate(types))
    la = ", ".join(f"%l{i}=%arg{i}" for i in range(n))
    sa = ", ".join(f"%s{i}=%l{i}" for i in range(n))
    ha = ", ".join(f"%a{i}=%s{i}" for i in range(n))
    tys = ", ".join(types)
    return f"""module {{
  {channels}
  func.func @{name}({fargs}) {{
    %c1 = arith.constant 1 : index
    air.launch (%lx) in (%lsx=%c1) args({la}) : {tys} {{
      air.segment @seg args({sa}) : {tys} {{
        %hx = arith.constant {sizes[0]} : index
        %hy = arith.constant {sizes[1]} : index
        {outer}
        air.herd @h tile (%tx, %ty) in (%sx=%hx, %sy=%hy) args({ha}) : {tys} {{
          %c0 = arith.constant 0 : index
          %c1_ = arith.constant 1 : index
          %c2 = arith.constant 2 : index
          %c4 = arith.constant 4 : index
          %c8 = arith.constant 8 : index
          %c16 = arith.constant 16 : index
          %c64 = arith.constant 64 : index
          %c256 = arith.constant 256 : index
          %c1024 = arith.constant 1024 : index
          %c8192 = arith.constant 8192 : index
          {body}
        }}
      }}
    }}
    return
  }}
}}
"""


def resources(text: str, **kw) -> set[str]:
    return analyze_module(text, **kw).resources()


# ------------------------------------------------------------------------------------------ known rejections

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


def _pingpong_body(first_writer: str) -> str:
    # two 16 KiB input tiles allocated in a 4-trip loop and an 8 KiB output outside it: 40 KiB + stack with
    # one copy each, 72 KiB + stack once the ping-pong transform doubles the DMA-filled inputs
    fill = {"dma": "air.dma_memcpy_nd (%x[] [] [], %a0[%off] [%c8192] [%c1_]) : (memref<8192xbf16, 2 : i32>, memref<262144xbf16>)",
            "call": "func.call @produce(%x) : (memref<8192xbf16, 2 : i32>) -> ()"}[first_writer]
    return f"""
          %base = arith.muli %tx, %c64 : index
          %o = memref.alloc() : memref<4096xbf16, 2 : i32>
          scf.for %i = %c0 to %c4 step %c1_ {{
            %t = arith.addi %base, %i : index
            %off = arith.muli %t, %c1024 : index
            %x = memref.alloc() : memref<8192xbf16, 2 : i32>
            %w = memref.alloc() : memref<8192xbf16, 2 : i32>
            {fill}
            air.dma_memcpy_nd (%w[] [] [], %a0[%off] [%c8192] [%c1_]) : (memref<8192xbf16, 2 : i32>, memref<262144xbf16>)
            func.call @consume(%x, %w, %o) : (memref<8192xbf16, 2 : i32>, memref<8192xbf16, 2 : i32>, memref<4096xbf16, 2 : i32>) -> ()
            memref.dealloc %x : memref<8192xbf16, 2 : i32>
            memref.dealloc %w : memref<8192xbf16, 2 : i32>
          }}"""


def test_l1_overflow_once_ping_pong_copies_and_stack_count():
    text = herd_module(_pingpong_body("dma"), "memref<262144xbf16>", sizes=(4, 1))
    rep = analyze_module(text, "pp")
    assert rep.resources() == {"core L1 bytes"}
    assert rep.usage.l1_bytes == 2 * 16384 + 2 * 16384 + 8192 + 1024
    assert "core L1 bytes 74752/65536" in rep.first_violation()
    # the same module with ping-pong omitted fits (one copy of each + stack)
    single = analyze_module(text, "pp", preset=AirccPreset(omit_pingpong="L1"))
    assert single.ok and single.usage.l1_bytes == 16384 * 2 + 8192 + 1024
    # a buffer first accessed by an external call (which may read it) disqualifies the loop: nothing doubled
    call_first = analyze_module(herd_module(_pingpong_body("call"), "memref<262144xbf16>", sizes=(4, 1)))
    assert call_first.ok and call_first.usage.l1_bytes == 16384 * 2 + 8192 + 1024


def test_l1_stack_size_preset_counts():
    text = herd_module(_pingpong_body("call"), "memref<262144xbf16>", sizes=(4, 1))
    assert analyze_module(text, preset=AirccPreset(stack_size=24576)).ok
    assert analyze_module(text, preset=AirccPreset(stack_size=25600)).resources() == {"core L1 bytes"}


def test_too_many_bds_on_a_shim_tile():
    # a segment-level L3 -> L2 DMA with a 6-D pattern: the two dims beyond the shim's 4 are unrolled into
    # 5 x 4 = 20 BDs issued back to back on one shim column (16 BDs per tile)
    outer = """
        %cc0 = arith.constant 0 : index
        %cc1 = arith.constant 1 : index
        %cc2 = arith.constant 2 : index
        %cc4 = arith.constant 4 : index
        %cc5 = arith.constant 5 : index
        %cc8 = arith.constant 8 : index
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
    assert rep.resources() == {"shim BDs"}
    assert rep.usage.shim_bds == 20 and "shim BDs 20/16" in rep.first_violation()
    # one unrolled dim fewer: 5 BDs fit
    fewer = outer.replace("[%cc5, %cc4, %cc2", "[%cc5, %cc1, %cc2")
    assert analyze_module(herd_module("", "memref<655360xbf16>", sizes=(1, 1), outer=fewer)).usage.shim_bds == 5


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
    assert v.kind == "rule" and "64 DMA tasks per launch" in v.detail
    # the same walk written affinely folds into one BD per tile
    affine = body.replace("%row = arith.divui %off, %c1024 : index", "%row = arith.muli %c0, %c0 : index")
    affine = affine.replace("%col = arith.remui %off, %c1024 : index", "%col = arith.addi %off, %c0 : index")
    assert resources(herd_module(affine, "memref<128x1024xbf16>", sizes=(2, 1))) == set()


def test_broadcast_loaded_outside_the_loop_of_a_multi_tile_herd():
    # gemv/rmsnorm/flash_attn today: air-dma-to-channel fails "operand does not dominate this use"
    body = """
          %v = memref.alloc() : memref<64xbf16, 2 : i32>
          air.dma_memcpy_nd (%v[] [] [], %a0[%c0] [%c64] [%c1_]) : (memref<64xbf16, 2 : i32>, memref<64xbf16>)
          scf.for %i = %c0 to %c4 step %c1_ {
            func.call @use(%v) : (memref<64xbf16, 2 : i32>) -> ()
          }"""
    rep = analyze_module(herd_module(body, "memref<64xbf16>", sizes=(8, 1)))
    assert rep.resources() == {"core DMA placement"}
    assert "operand does not dominate this use" in rep.first_violation()
    # a single-tile herd, or the load moved into the loop, lowers
    assert resources(herd_module(body, "memref<64xbf16>", sizes=(1, 1))) == set()
    inside = body.replace("""air.dma_memcpy_nd (%v[] [] [], %a0[%c0] [%c64] [%c1_]) : (memref<64xbf16, 2 : i32>, memref<64xbf16>)
          scf.for %i = %c0 to %c4 step %c1_ {""", """scf.for %i = %c0 to %c4 step %c1_ {
            air.dma_memcpy_nd (%v[] [] [], %a0[%c0] [%c64] [%c1_]) : (memref<64xbf16, 2 : i32>, memref<64xbf16>)""")
    assert resources(herd_module(inside, "memref<64xbf16>", sizes=(8, 1))) == set()


def test_three_inbound_streams_per_core_and_soft_float_stack():
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
    rep = analyze_module(herd_module(body, "memref<64xbf16>", sizes=(1, 1)))
    assert rep.resources() == {"core S2MM channels", "core stack bytes"}
    assert rep.usage.stack_need == NPU2.soft_float_div_stack_bytes
    assert analyze_module(herd_module(body, "memref<64xbf16>", sizes=(1, 1)),
                          preset=AirccPreset(stack_size=2048)).resources() == {"core S2MM channels"}


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


def _launch_grid_io(n: int) -> str:
    """A [1, n] launch grid; each iteration reads a row block of %arg0 and writes one of %arg1 through L2."""
    return f"""module {{
  func.func @grid(%arg0: memref<{8 * n}x64xbf16>, %arg1: memref<{8 * n}x64xbf16>) {{
    %c1 = arith.constant 1 : index
    %cn = arith.constant {n} : index
    air.launch (%lx, %ly) in (%sx=%c1, %sy=%cn) args(%l0=%arg0, %l1=%arg1) : memref<{8 * n}x64xbf16>, memref<{8 * n}x64xbf16> {{
      air.segment @seg args(%s0=%l0, %s1=%l1, %y=%ly) : memref<{8 * n}x64xbf16>, memref<{8 * n}x64xbf16>, index {{
        %c0 = arith.constant 0 : index
        %c1_ = arith.constant 1 : index
        %c8 = arith.constant 8 : index
        %c64 = arith.constant 64 : index
        %r = arith.muli %y, %c8 : index
        %b = memref.alloc() : memref<8x64xbf16, 1 : i32>
        air.dma_memcpy_nd (%b[] [] [], %s0[%r, %c0] [%c8, %c64] [%c64, %c1_]) : (memref<8x64xbf16, 1 : i32>, memref<{8 * n}x64xbf16>)
        air.dma_memcpy_nd (%s1[%r, %c0] [%c8, %c64] [%c64, %c1_], %b[] [] []) : (memref<{8 * n}x64xbf16>, memref<8x64xbf16, 1 : i32>)
        memref.dealloc %b : memref<8x64xbf16, 1 : i32>
      }}
    }}
    return
  }}
}}
"""


def test_untiled_launch_grid_holds_a_shim_bd_per_write_and_iteration():
    """Without runtime loop tiling the runtime sequence configures every launch iteration's DMA tasks before it
    waits: a DDR write (never folded over the launch grid) holds one BD per iteration, a DDR read folds the
    grid into one BD (the real lowering of the 1x16-launch GEMM: 16 C-row tasks per shim tile, 'Allocator
    exhausted available buffer descriptor IDs'; tiling 2,2 lowers). Tiling bounds the iterations per wait."""
    rep = analyze_module(_launch_grid_io(24), "grid")
    assert rep.resources() == {"shim BDs"}
    assert "shim BDs 25/16" in rep.first_violation() and "24 launch iterations" in rep.first_violation()
    ok = analyze_module(_launch_grid_io(24), "grid", preset=AirccPreset(runtime_loop_tiling_sizes=(1, 2)))
    assert ok.ok, ok.first_violation()
    assert ok.usage.shim_bds == 3   # 2 writes in flight + the read folded over the 2-iteration tile
    assert analyze_module(_launch_grid_io(12), "grid").ok   # 12 writes + 1 read fit 16


# ------------------------------------------------------------------------------------------ valid patterns

CHANNELS = """air.channel @ca [8, 1] {broadcast_shape = [8, 4]}
  air.channel @cb [1, 4] {broadcast_shape = [8, 4]}"""


def _staged_gemm(drain: bool) -> str:
    """A/B staged in L2 and broadcast to an 8x4 herd; C either drained into an L2 buffer written to L3 by one
    DMA (drain=True) or stored by every core (drain=False)."""
    outer = """
        %cc0 = arith.constant 0 : index
        %cc1 = arith.constant 1 : index
        %cc8 = arith.constant 8 : index
        %cc32 = arith.constant 32 : index
        %cc64 = arith.constant 64 : index
        %cc256 = arith.constant 256 : index
        %cc512 = arith.constant 512 : index
        %cres = memref.alloc() : memref<64x128xbf16, 1 : i32>
        scf.for %kk = %cc0 to %cc512 step %cc32 {
          %al2 = memref.alloc() : memref<64x32xbf16, 1 : i32>
          %bl2 = memref.alloc() : memref<32x128xbf16, 1 : i32>
          air.dma_memcpy_nd (%al2[] [] [], %s0[%cc0, %kk] [%cc64, %cc32] [%cc512, %cc1]) : (memref<64x32xbf16, 1 : i32>, memref<64x512xbf16>)
          air.dma_memcpy_nd (%bl2[] [] [], %s1[%kk, %cc0] [%cc32, %cc256] [%cc256, %cc1]) : (memref<32x128xbf16, 1 : i32>, memref<512x256xbf16>)
          air.channel.put @ca[%cc0, %cc0] (%al2[%cc0, %cc0] [%cc8, %cc32] [%cc32, %cc1]) : (memref<64x32xbf16, 1 : i32>)
          air.channel.put @ca[%cc1, %cc0] (%al2[%cc8, %cc0] [%cc8, %cc32] [%cc32, %cc1]) : (memref<64x32xbf16, 1 : i32>)
          memref.dealloc %al2 : memref<64x32xbf16, 1 : i32>
          memref.dealloc %bl2 : memref<32x128xbf16, 1 : i32>
        }"""
    # (puts for herd rows 0 and 1 only keep the text small: the model counts endpoints, it does not pair FIFOs)
    store = ("air.dma_memcpy_nd (%a3[%r, %cl] [%c8, %c16] [%c64x, %c1_], %c_l1[] [] []) : "
             "(memref<64x128xbf16, 1 : i32>, memref<8x16xbf16, 2 : i32>)") if drain else \
        ("air.dma_memcpy_nd (%a2[%r, %cl] [%c8, %c16] [%c256, %c1_], %c_l1[] [] []) : "
         "(memref<64x256xbf16>, memref<8x16xbf16, 2 : i32>)")
    body = f"""
          %c64x = arith.constant 128 : index
          %r = arith.muli %tx, %c8 : index
          %cl = arith.muli %ty, %c16 : index
          %acc = memref.alloc() : memref<8x16xf32, 2 : i32>
          scf.for %k = %c0 to %c16 step %c1_ {{
            %a_l1 = memref.alloc() : memref<8x32xbf16, 2 : i32>
            %b_l1 = memref.alloc() : memref<32x16xbf16, 2 : i32>
            air.channel.get @ca[%tx, %ty] (%a_l1[] [] []) : (memref<8x32xbf16, 2 : i32>)
            air.channel.get @cb[%tx, %ty] (%b_l1[] [] []) : (memref<32x16xbf16, 2 : i32>)
            func.call @mm(%a_l1, %b_l1, %acc) : (memref<8x32xbf16, 2 : i32>, memref<32x16xbf16, 2 : i32>, memref<8x16xf32, 2 : i32>) -> ()
            memref.dealloc %a_l1 : memref<8x32xbf16, 2 : i32>
            memref.dealloc %b_l1 : memref<32x16xbf16, 2 : i32>
          }}
          %c_l1 = memref.alloc() : memref<8x16xbf16, 2 : i32>
          func.call @cast(%acc, %c_l1) : (memref<8x16xf32, 2 : i32>, memref<8x16xbf16, 2 : i32>) -> ()
          {store}"""
    text = herd_module(body, "memref<64x512xbf16>; memref<512x256xbf16>; memref<64x256xbf16>", sizes=(8, 4),
                       outer=outer, channels=CHANNELS)
    if drain:  # the herd gets the L2 result buffer as a 4th operand; one DMA writes it to L3 after the herd
        text = text.replace("args(%a0=%s0, %a1=%s1, %a2=%s2) : memref<64x512xbf16>, memref<512x256xbf16>, "
                            "memref<64x256xbf16> {",
                            "args(%a0=%s0, %a1=%s1, %a2=%s2, %a3=%cres) : memref<64x512xbf16>, memref<512x256xbf16>, "
                            "memref<64x256xbf16>, memref<64x128xbf16, 1 : i32> {")
        text = text.replace("        }\n      }\n    }\n    return", """        }
        air.dma_memcpy_nd (%s2[%cc0, %cc0] [%cc64, %cc256] [%cc256, %cc1], %cres[] [] []) : (memref<64x256xbf16>, memref<64x128xbf16, 1 : i32>)
      }
    }
    return""", 1)
    return text


def test_l2_staged_broadcast_and_l2_drain_pass():
    rep = analyze_module(_staged_gemm(drain=True), "staged")
    assert rep.ok, rep.first_violation()
    u = rep.usage
    assert u.shim_mm2s == 2 and u.shim_s2mm == 1          # A and B panels in, one C write out
    assert u.core_s2mm == 2 and u.core_mm2s == 1
    assert u.memtile_s2mm == 2 + 32 and u.memtile_mm2s == 2 + 1
    assert u.memtiles <= NPU2.memtiles


def test_l2_staged_broadcast_with_per_core_stores_fails_on_the_stores_only():
    rep = analyze_module(_staged_gemm(drain=False), "staged")
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


# ------------------------------------------------------------------------------------------ CLI

def test_hw_check_cli_exit_codes_and_one_line_per_violation(tmp_path, capsys):
    good = tmp_path / "good.mlir"
    good.write_text(_staged_gemm(drain=True))
    bad = tmp_path / "bad.mlir"
    bad.write_text(herd_module("""
          %out = memref.alloc() : memref<8x64xbf16, 2 : i32>
          %r = arith.muli %tx, %c8 : index
          %c_ = arith.muli %ty, %c64 : index
          air.dma_memcpy_nd (%a0[%r, %c_] [%c8, %c64] [%c256, %c1_], %out[] [] []) : (memref<64x256xbf16>, memref<8x64xbf16, 2 : i32>)""",
                               "memref<64x256xbf16>"))
    assert cli_main(["hw-check", str(good)]) == 0
    out = capsys.readouterr().out
    assert "good" in out and " ok" in out
    assert cli_main(["hw-check", str(good), str(bad)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert [ln for ln in out if ln.startswith("bad: launch 0")] == \
        [next(ln for ln in out if "shim S2MM channels 32/16" in ln)]
    garbage = tmp_path / "garbage.mlir"
    garbage.write_text("module { func.func @f( {")
    assert cli_main(["hw-check", str(garbage)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "garbage.mlir" in err and "Traceback" not in err
    assert cli_main(["hw-check", str(tmp_path / "missing.mlir")]) == 2


def test_unreadable_text_is_one_line_error():
    with pytest.raises(HwParseError, match="line"):
        analyze_module(herd_module("%z = memref.alloc(%c1_) : memref<?xbf16, 2 : i32>", "memref<64xbf16>"))
