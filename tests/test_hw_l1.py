"""The NPU2 hardware model (kernel_builder/hw) on hand-written AIR modules, a core's own memory: L1 overflow
counted with ping-pong copies and the stack, the ping-pong rules and presets (docs/hardware-model.md)."""
from __future__ import annotations

from kernel_builder.hw import analyze, analyze_module
from kernel_builder.presets import AirccPreset
from tests.hw_texts import herd_module, pingpong_body, resources

def test_l1_overflow_once_ping_pong_copies_and_stack_count():
    text = herd_module(pingpong_body("dma"), "memref<262144xbf16>", sizes=(4, 1))
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
    call_first = herd_module(pingpong_body("call"), "memref<262144xbf16>", sizes=(4, 1))
    assert analyze_module(call_first).resources() == {"core L1 bytes"}
    monkeypatch.setattr(analyze, "PINGPONG_RULE", "candidates")
    rep = analyze_module(call_first)
    assert rep.ok and rep.usage.l1_bytes == 16384 * 2 + 8192 + 1024
    dma_first = analyze_module(herd_module(pingpong_body("dma"), "memref<262144xbf16>", sizes=(4, 1)))
    assert dma_first.resources() == {"core L1 bytes"}


def test_l1_stack_size_preset_counts():
    text = herd_module(pingpong_body("call"), "memref<262144xbf16>", sizes=(4, 1))
    assert analyze_module(text, preset=AirccPreset(omit_pingpong="L1", stack_size=24576)).ok
    assert analyze_module(text, preset=AirccPreset(omit_pingpong="L1", stack_size=25600)).resources() == \
        {"core L1 bytes"}


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
