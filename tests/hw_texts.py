"""Hand-written AIR modules for the hardware-model tests (test_hw_*.py, test_hw_tune.py): a launch > segment >
herd wrapper around a herd body, the ping-pong body and the L2-staged GEMM (A/B broadcast from L2, C drained
through L2 or stored by every core)."""
from __future__ import annotations

from kernel_builder.hw import analyze_module


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


def pingpong_body(first_writer: str) -> str:
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


CHANNELS = """air.channel @ca [8, 1] {broadcast_shape = [8, 4]}
  air.channel @cb [1, 4] {broadcast_shape = [8, 4]}"""


def staged_gemm(drain: bool) -> str:
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
