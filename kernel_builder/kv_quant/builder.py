"""The KV8 cache writer: K (half 0) or V (half 1) rows of a call quantized into that half of the KV8 cache window
(codes and scales; kernel_builder/kv_quant/reference.py has the row layout; docs/quantization.md "KV cache").

Arguments (SIGNATURES["kv_quant"]): x bf16 [rows, kv_heads*hd], kv i8 [rows, row_bytes] (in place: the other
half's bytes are not touched). MLIR + external C++
(external_kernels/kv_quant.cc). A bare `air.herd` [tiles, 1] (the stitcher wraps it; the data movement of
dequant_q4's builder): tile t owns rows [t*R, (t+1)*R); per step tile_m rows of x L3 -> L1 (allocated in the loop:
ping-pong), one call writes their codes and f32 scales (as bytes) into L1 buffers allocated once, two DMAs store
them into the half's codes and scale of every kv head's block of each KV8 row. One L3
stream in and two out per tile.
"""
from __future__ import annotations

from kernel_builder.emit import L1, Module, attr_dict, herd, memref, tile_steps
from kernel_builder.kv_quant.external import kv_quant_kernel
from kernel_builder.kv_quant.plan import plan_kv_quant
from kernel_builder.kv_quant.reference import SCALE_BYTES, block_bytes, row_bytes

KIND = "kv_quant"


def build(rows: int, kv_heads: int, head_dim: int, half: int) -> str:
    if half not in (0, 1):
        raise ValueError(f"kv_quant: half must be 0 (K) or 1 (V), got {half!r}")
    plan = plan_kv_quant(rows, kv_heads, head_dim)
    w, tm, per = plan.width, plan.tile_m, plan.rows_per_tile
    rb, sb, bb = row_bytes(kv_heads, head_dim), SCALE_BYTES * kv_heads, block_bytes(head_dim)
    ext = kv_quant_kernel(tm, kv_heads, head_dim)
    x_ty, kv_ty = memref([rows, w]), memref([rows, rb], "i8")
    xl_ty, cl_ty, sl_ty = memref([tm * w], "bf16", L1), memref([tm * w], "i8", L1), memref([tm * sb], "i8", L1)
    mod = Module(KIND, [x_ty, kv_ty])
    mod.declare(ext.symbol, ext.obj, [xl_ty, cl_ty, sl_ty])
    attrs = [attr_dict(KIND, {"rows": rows, "kv_heads": kv_heads, "head_dim": head_dim, "half": half}),
             f'link_with = "{ext.obj}"']
    h = herd(mod.body, "kvq_herd", (plan.tiles, 1), [(mod.args[0], x_ty), (mod.args[1], kv_ty)], attrs)
    b = h.body
    x, kv = h.args
    cl, sl = b.alloc("codes_l1", cl_ty), b.alloc("scales_l1", sl_ty)   # written by the call
    loop, row = tile_steps(b, h.ids[0], per, tm, plan.steps, [(cl, cl_ty), (sl, sl_ty)])
    xl = loop.alloc("x_l1", xl_ty)
    loop.dma(xl, xl_ty, None, x, x_ty, ([row, 0], [tm, w], [w, 1]))
    loop.call(ext.symbol, [(xl, xl_ty), (cl, cl_ty), (sl, sl_ty)])
    hd = head_dim
    loop.dma(kv, kv_ty, ([row, 0, half * hd], [tm, kv_heads, hd], [rb, bb, 1]), cl, cl_ty, None)
    loop.dma(kv, kv_ty, ([row, 0, 2 * hd + half * SCALE_BYTES], [tm, kv_heads, SCALE_BYTES], [rb, bb, 1]), sl, sl_ty,
             None)
    loop.dealloc(xl, xl_ty)
    b.dealloc(cl, cl_ty)
    b.dealloc(sl, sl_ty)
    return mod.text()
