"""The NPU2 hardware model (kernel_builder/hw) on hand-written AIR modules: each known rejection fails with the
right resource named, the valid staging patterns pass, and `llama-npu hw-check` reports them in one line each
(docs/hardware-model.md)."""
from __future__ import annotations

import pytest

from kernel_builder.hw import NPU2, HwParseError, analyze, analyze_module
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


def _gemm_k_loop(trips: int) -> str:
    """One core, A [32, 64] and B [64, 96] tiles per K step, f32 accumulator and bf16 C tile outside the loop."""
    k = 64 * trips
    body = f"""
          %cK = arith.constant {k} : index
          %c32 = arith.constant 32 : index
          %c96 = arith.constant 96 : index
          %cst = arith.constant 0.0 : f32
          %acc = memref.alloc() : memref<32x96xf32, 2 : i32>
          linalg.fill ins(%cst : f32) outs(%acc : memref<32x96xf32, 2 : i32>)
          scf.for %k = %c0 to %cK step %c64 {{
            %al = memref.alloc() : memref<32x64xbf16, 2 : i32>
            %bl = memref.alloc() : memref<64x96xbf16, 2 : i32>
            air.dma_memcpy_nd (%al[] [] [], %a0[%c0, %k] [%c32, %c64] [%cK, %c1_]) : (memref<32x64xbf16, 2 : i32>, memref<32x{k}xbf16>)
            air.dma_memcpy_nd (%bl[] [] [], %a1[%k, %c0] [%c64, %c96] [%c96, %c1_]) : (memref<64x96xbf16, 2 : i32>, memref<{k}x96xbf16>)
            linalg.matmul ins(%al, %bl : memref<32x64xbf16, 2 : i32>, memref<64x96xbf16, 2 : i32>) outs(%acc : memref<32x96xf32, 2 : i32>)
            memref.dealloc %al : memref<32x64xbf16, 2 : i32>
            memref.dealloc %bl : memref<64x96xbf16, 2 : i32>
          }}
          %cl = memref.alloc() : memref<32x96xbf16, 2 : i32>
          air.dma_memcpy_nd (%a2[] [] [], %cl[] [] []) : (memref<32x96xbf16>, memref<32x96xbf16, 2 : i32>)"""
    return herd_module(body, f"memref<32x{k}xbf16>; memref<{k}x96xbf16>; memref<32x96xbf16>", sizes=(1, 1))


def test_odd_trip_count_keeps_a_third_ping_pong_copy():
    """Unrolling by 2 leaves an epilogue iteration when the trip count is odd; its allocation is a third buffer.
    The real lowering agrees: K = 8 steps lowers, K = 9 steps fails in aie-assign-buffer-addresses."""
    even = analyze_module(_gemm_k_loop(8))
    assert even.ok and even.usage.l1_bytes == 12288 + 2 * (4096 + 12288) + 6144 + 1024
    odd = analyze_module(_gemm_k_loop(9), "gemm_k9")
    assert odd.resources() == {"core L1 bytes"}
    assert "core L1 bytes 68608/65536" in odd.first_violation() and "%al 4096x3, %bl 12288x3" in odd.first_violation()


def test_ping_pong_rules(monkeypatch):
    """The mlir-air the lowering toolchain builds doubles every buffer of a loop that allocates; mlir-air HEAD
    (PINGPONG_RULE = "candidates") skips a loop whose buffer is first touched by an external call."""
    call_first = herd_module(_pingpong_body("call"), "memref<262144xbf16>", sizes=(4, 1))
    assert analyze_module(call_first).resources() == {"core L1 bytes"}
    monkeypatch.setattr(analyze, "PINGPONG_RULE", "candidates")
    rep = analyze_module(call_first)
    assert rep.ok and rep.usage.l1_bytes == 16384 * 2 + 8192 + 1024
    dma_first = analyze_module(herd_module(_pingpong_body("dma"), "memref<262144xbf16>", sizes=(4, 1)))
    assert dma_first.resources() == {"core L1 bytes"}


def test_l1_stack_size_preset_counts():
    text = herd_module(_pingpong_body("call"), "memref<262144xbf16>", sizes=(4, 1))
    assert analyze_module(text, preset=AirccPreset(omit_pingpong="L1", stack_size=24576)).ok
    assert analyze_module(text, preset=AirccPreset(omit_pingpong="L1", stack_size=25600)).resources() == \
        {"core L1 bytes"}


def launch_grid_module(bi: int) -> str:
    """A [bi, 2] launch grid whose segment streams A[bi*64 .., kp] panels through L2 to a 1x1 herd. The K loop and
    the (repeat) bj dim fold into the shim BD; bi no longer fits its 4 dims, so every bi iteration is a DMA
    task issued before the launch's wait."""
    return f"""module {{
  air.channel @c [1, 1]
  func.func private @use(memref<64x32xbf16, 2 : i32>) attributes {{llvm.emit_c_interface}}
  func.func @g(%arg0: memref<2048x512xbf16>) {{
    %cbi = arith.constant {bi} : index
    %c2 = arith.constant 2 : index
    air.launch (%bi, %bj) in (%sbi=%cbi, %sbj=%c2) args(%la=%arg0) : memref<2048x512xbf16> {{
      air.segment @seg args(%sa=%la, %sx=%bi) : memref<2048x512xbf16>, index {{
        %c0 = arith.constant 0 : index
        %c1 = arith.constant 1 : index
        %c32 = arith.constant 32 : index
        %c64 = arith.constant 64 : index
        %c512 = arith.constant 512 : index
        %m0 = arith.muli %sx, %c64 : index
        scf.for %kp = %c0 to %c512 step %c64 {{
          %l2 = memref.alloc() : memref<64x32xbf16, 1 : i32>
          air.dma_memcpy_nd (%l2[] [] [], %sa[%m0, %kp] [%c64, %c32] [%c512, %c1]) : (memref<64x32xbf16, 1 : i32>, memref<2048x512xbf16>)
          air.channel.put @c[%c0, %c0] (%l2[] [] []) : (memref<64x32xbf16, 1 : i32>)
          memref.dealloc %l2 : memref<64x32xbf16, 1 : i32>
        }}
        %h1 = arith.constant 1 : index
        air.herd @h tile (%tx, %ty) in (%hx=%h1, %hy=%h1) {{
          %k0 = arith.constant 0 : index
          %k1 = arith.constant 1 : index
          %k8 = arith.constant 8 : index
          scf.for %k = %k0 to %k8 step %k1 {{
            %l1 = memref.alloc() : memref<64x32xbf16, 2 : i32>
            air.channel.get @c[%tx, %ty] (%l1[] [] []) : (memref<64x32xbf16, 2 : i32>)
            func.call @use(%l1) : (memref<64x32xbf16, 2 : i32>) -> ()
            memref.dealloc %l1 : memref<64x32xbf16, 2 : i32>
          }}
        }}
      }}
    }}
    return
  }}
}}
"""


def test_too_many_bds_on_a_shim_tile():
    # real lowering: bi = 32 fails in aie-assign-runtime-sequence-bd-ids ("Allocator exhausted available buffer
    # descriptor IDs"); bi = 2 lowers; so does bi = 32 with --air-runtime-loop-tiling-sizes=2,2
    rep = analyze_module(launch_grid_module(32))
    assert rep.resources() == {"shim BDs"}
    assert rep.usage.shim_bds == 32 and "shim BDs 32/16" in rep.first_violation()
    assert analyze_module(launch_grid_module(2)).ok
    tiled = analyze_module(launch_grid_module(32), preset=AirccPreset(runtime_loop_tiling_sizes=(2, 2)))
    assert tiled.ok and tiled.usage.shim_bds == 2


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


def _nested_broadcast(outer_lb: str) -> str:
    # an outer loop that allocates (per-tile y) around an inner loop that allocates x loaded once for all tiles
    return f"""
          %r = arith.muli %tx, %c64 : index
          %lbj = arith.muli {outer_lb}, %c1_ : index
          scf.for %j = %lbj to %c4 step %c2 {{
            %y = memref.alloc() : memref<64xbf16, 2 : i32>
            air.dma_memcpy_nd (%y[] [] [], %a0[%r] [%c64] [%c1_]) : (memref<64xbf16, 2 : i32>, memref<1024xbf16>)
            scf.for %i = %c0 to %c4 step %c1_ {{
              %x = memref.alloc() : memref<64xbf16, 2 : i32>
              %off = arith.muli %i, %c64 : index
              air.dma_memcpy_nd (%x[] [] [], %a0[%off] [%c64] [%c1_]) : (memref<64xbf16, 2 : i32>, memref<1024xbf16>)
              func.call @use2(%x, %y) : (memref<64xbf16, 2 : i32>, memref<64xbf16, 2 : i32>) -> ()
              memref.dealloc %x : memref<64xbf16, 2 : i32>
            }}
            memref.dealloc %y : memref<64xbf16, 2 : i32>
          }}"""


def test_ping_pong_of_a_dynamic_loop_around_a_broadcast_load():
    # real lowering: air-ping-pong-transform fails "operand #0 does not dominate this use" when the outer loop's
    # trip count depends on the tile id (today's flash attention); a static outer loop lowers
    rep = analyze_module(herd_module(_nested_broadcast("%tx"), "memref<1024xbf16>", sizes=(4, 1)))
    assert rep.resources() == {"core ping-pong"}
    assert rep.violations[0].stage == "air-ping-pong-transform"
    assert "operand #0 does not dominate this use" in rep.first_violation()
    assert resources(herd_module(_nested_broadcast("%c0"), "memref<1024xbf16>", sizes=(4, 1))) == set()
    assert analyze_module(herd_module(_nested_broadcast("%tx"), "memref<1024xbf16>", sizes=(4, 1)),
                          preset=AirccPreset(omit_pingpong="L1")).ok


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


def _launch_grid_io(n: int, writes: int = 2) -> str:
    """A [1, n] launch grid; each iteration reads an 8-row block of %arg0 into L2 and writes it to %arg1 with
    `writes` DMAs of 8 / writes rows each (like the GEMM's C row panels)."""
    rows = 8 // writes
    t_in, t_l2 = f"memref<{8 * n}x64xbf16>", "memref<8x64xbf16, 1 : i32>"
    body = []
    for j in range(writes):
        body.append(f"%o{j} = arith.constant {j * rows} : index")
        body.append(f"%r{j} = arith.addi %r, %o{j} : index")
        body.append(f"air.dma_memcpy_nd (%s1[%r{j}, %c0] [%cr, %c64] [%c64, %c1_], %b[%o{j}, %c0] [%cr, %c64] "
                    f"[%c64, %c1_]) : ({t_in}, {t_l2})")
    writes_text = "\n        ".join(body)
    return f"""module {{
  func.func @grid(%arg0: {t_in}, %arg1: {t_in}) {{
    %c1 = arith.constant 1 : index
    %cn = arith.constant {n} : index
    air.launch (%lx, %ly) in (%sx=%c1, %sy=%cn) args(%l0=%arg0, %l1=%arg1) : {t_in}, {t_in} {{
      air.segment @seg args(%s0=%l0, %s1=%l1, %y=%ly) : {t_in}, {t_in}, index {{
        %c0 = arith.constant 0 : index
        %c1_ = arith.constant 1 : index
        %c8 = arith.constant 8 : index
        %cr = arith.constant {rows} : index
        %c64 = arith.constant 64 : index
        %r = arith.muli %y, %c8 : index
        %b = memref.alloc() : {t_l2}
        air.dma_memcpy_nd (%b[] [] [], %s0[%r, %c0] [%c8, %c64] [%c64, %c1_]) : ({t_l2}, {t_in})
        {writes_text}
        memref.dealloc %b : {t_l2}
      }}
    }}
    return
  }}
}}
"""


def _puts_on_one_channel(n: int) -> str:
    """n launch-level puts of one row each on ONE channel index (one shim stream), a one-tile herd taking them
    in a loop and storing each row back (one S2MM BD: the loop folds into it)."""
    puts = "\n".join(f"      %r{i} = arith.constant {i} : index\n      air.channel.put @p[%c0, %c0] "
                     f"(%la[%r{i}, %c0] [%c1, %c64] [%c64, %c1]) : (memref<32x64xbf16>)" for i in range(n))
    return f"""module {{
  air.channel @p [1, 1]
  func.func @puts(%arg0: memref<32x64xbf16>, %arg1: memref<32x64xbf16>) {{
    %one = arith.constant 1 : index
    air.launch (%lx, %ly) in (%lsx=%one, %lsy=%one) args(%la=%arg0, %lb=%arg1) : memref<32x64xbf16>, memref<32x64xbf16> {{
      %c0 = arith.constant 0 : index
      %c1 = arith.constant 1 : index
      %c64 = arith.constant 64 : index
{puts}
      air.segment @s args(%sb=%lb) : memref<32x64xbf16> {{
        %c1_s = arith.constant 1 : index
        air.herd @h tile (%tx, %ty) in (%hx=%c1_s, %hy=%c1_s) args(%hb=%sb) : memref<32x64xbf16> {{
          %z = arith.constant 0 : index
          %o = arith.constant 1 : index
          %k = arith.constant 64 : index
          %n = arith.constant {n} : index
          scf.for %i = %z to %n step %o {{
            %buf = memref.alloc() : memref<64xbf16, 2 : i32>
            air.channel.get @p[%tx, %ty] (%buf[] [] []) : (memref<64xbf16, 2 : i32>)
            air.dma_memcpy_nd (%hb[%i, %z] [%o, %k] [%k, %o], %buf[] [] []) : (memref<32x64xbf16>, memref<64xbf16, 2 : i32>)
            memref.dealloc %buf : memref<64xbf16, 2 : i32>
          }}
        }}
      }}
    }}
    return
  }}
}}
"""


def test_puts_on_one_channel_index_hold_a_shim_bd_each():
    """Puts on one channel index share one shim stream but each is its own DMA task with its own BD, all
    configured before any wait (the real lowering: 15 puts + the store = 16 BD ids on the shim tile, OK; 16 + 1:
    aie-assign-runtime-sequence-bd-ids "Allocator exhausted available buffer descriptor IDs"). The model used to
    count such a stream as one BD."""
    ok = analyze_module(_puts_on_one_channel(15), "puts")
    assert ok.ok and ok.usage.shim_bds == 16 and ok.usage.shim_mm2s == 1
    rep = analyze_module(_puts_on_one_channel(16), "puts")
    assert rep.resources() == {"shim BDs"}
    assert rep.usage.shim_bds == 17 and "shim BDs 17/16" in rep.first_violation()


def test_untiled_launch_grid_holds_a_shim_bd_per_write_and_iteration():
    """Without runtime loop tiling the runtime sequence configures every launch iteration's DMA tasks before it
    waits. Two writes to one output per iteration are chained (write-after-write) and fold no launch dim, so
    each holds a BD per iteration; a read, or a lone write, folds the grid into one BD (the real lowering of the
    1x16-launch GEMM: 16 C-row tasks per shim tile, 'Allocator exhausted available buffer descriptor IDs';
    tiling 2,2 lowers). Tiling bounds the iterations in flight."""
    rep = analyze_module(_launch_grid_io(24), "grid")
    assert rep.resources() == {"shim BDs"}
    assert "24 DMA tasks in flight" in rep.first_violation()
    tiled = analyze_module(_launch_grid_io(24), "grid", preset=AirccPreset(runtime_loop_tiling_sizes=(1, 2)))
    assert tiled.ok, tiled.first_violation()
    assert analyze_module(_launch_grid_io(24, writes=1), "grid").ok   # a lone store folds the grid
    assert analyze_module(_launch_grid_io(6), "grid").ok              # 2 x 6 in flight + the read fit 16


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
