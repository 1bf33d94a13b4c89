"""KV8 cache window -> bf16 K and V rows (kernel_builder/kv_quant/reference.py has the format): what a prefill
chunk's attention reads when the cache is int8 (docs/quantization.md "KV cache").

Arguments (SIGNATURES["kv_dequant"]): kv i8 [rows, row_bytes], k and v bf16 [rows, kv_heads*hd] (written). MLIR +
external C++ (external_kernels/kv_dequant.cc). A bare `air.herd` [tiles, 1] (the stitcher wraps it; dequant_q4's
data movement): tile t owns rows [t*R, (t+1)*R); per step two DMAs gather tile_m rows' codes (per row the K codes of
every kv head, then the V codes) and scales (K, then V) out of the kv heads' blocks into L1 (allocated in the loop: ping-pong), one call writes their K and V rows into two L1 buffers
allocated once, two DMAs store them. Two L3 streams in and two out per tile.
"""
from __future__ import annotations

from kernel_builder.emit import L1, Module, attr_dict, herd, memref
from kernel_builder.kv_dequant.external import kv_dequant_kernel
from kernel_builder.kv_dequant.plan import plan_kv_dequant
from kernel_builder.kv_quant.reference import block_bytes, row_bytes

KIND = "kv_dequant"


def build(rows: int, kv_heads: int, head_dim: int) -> str:
    plan = plan_kv_dequant(rows, kv_heads, head_dim)
    w, tm, per = plan.width, plan.tile_m, plan.rows_per_tile
    rb, sb = row_bytes(kv_heads, head_dim), 8 * kv_heads
    ext = kv_dequant_kernel(tm, kv_heads, head_dim)
    kv_ty, o_ty = memref([rows, rb], "i8"), memref([rows, w])
    cl_ty, sl_ty, ol_ty = memref([tm * 2 * w], "i8", L1), memref([tm * sb], "i8", L1), memref([tm * w], "bf16", L1)
    mod = Module(KIND, [kv_ty, o_ty, o_ty])
    mod.declare(ext.symbol, ext.obj, [cl_ty, sl_ty, ol_ty, ol_ty])
    attrs = [attr_dict(KIND, {"rows": rows, "kv_heads": kv_heads, "head_dim": head_dim}), f'link_with = "{ext.obj}"']
    h = herd(mod.body, "kvd_herd", (plan.tiles, 1), [(mod.args[0], kv_ty), (mod.args[1], o_ty), (mod.args[2], o_ty)],
             attrs)
    b = h.body
    kv, k, v = h.args
    kl, vl = b.alloc("k_l1", ol_ty), b.alloc("v_l1", ol_ty)
    if plan.steps > 1:          # written by the call: one copy each, outside the ping-ponged loop
        b.pin_to_scope(kl, ol_ty)
        b.pin_to_scope(vl, ol_ty)
    first = b.muli(h.ids[0], per)
    loop, i = b.for_(0, per, tm, "r") if plan.steps > 1 else (b, 0)
    row = loop.addi(first, i) if plan.steps > 1 else first
    cl, sl = loop.alloc("codes_l1", cl_ty), loop.alloc("scales_l1", sl_ty)
    bb, hd = block_bytes(head_dim), head_dim
    loop.dma(cl, cl_ty, None, kv, kv_ty, ([row, 0, 0, 0], [tm, 2, kv_heads, hd], [rb, hd, bb, 1]))
    loop.dma(sl, sl_ty, None, kv, kv_ty, ([row, 0, 0, 2 * hd], [tm, 2, kv_heads, 4], [rb, 4, bb, 1]))
    loop.call(ext.symbol, [(cl, cl_ty), (sl, sl_ty), (kl, ol_ty), (vl, ol_ty)])
    loop.dma(k, o_ty, ([row, 0], [tm, w], [w, 1]), kl, ol_ty, None)
    loop.dma(v, o_ty, ([row, 0], [tm, w], [w, 1]), vl, ol_ty, None)
    loop.dealloc(cl, cl_ty)
    loop.dealloc(sl, sl_ty)
    b.dealloc(kl, ol_ty)
    b.dealloc(vl, ol_ty)
    return mod.text()
