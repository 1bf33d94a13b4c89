"""The NPU2 hardware model (kernel_builder/hw) on hand-written AIR modules, buffer descriptors of the shim
tiles: launch grids, puts on one channel index, untiled launch grids (docs/hardware-model.md)."""
from __future__ import annotations

from kernel_builder.hw import analyze_module
from kernel_builder.presets import AirccPreset


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
