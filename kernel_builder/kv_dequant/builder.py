"""KV8 cache window -> bf16 K and V rows (kernel_builder/kv_quant/reference.py has the format): what a prefill
chunk's attention reads when the cache is int8 (docs/quantization.md "KV cache").

Arguments (SIGNATURES["kv_dequant"]): kv i8 [rows, row_bytes], k and v bf16 [rows, kv_heads*hd] (written). MLIR +
external C++ (external_kernels/kv_dequant.cc). A bare `air.herd` [tiles, 1] (the stitcher wraps it; dequant_q4's
data movement): tile t owns rows [t*R, (t+1)*R); per step one DMA brings tile_m whole KV8 rows into L1 (allocated
in the loop: ping-pong; rows whole, so the step loop folds into the shim BD - a gather of codes and scales out of
the blocks did not: its BDs exhausted the runtime sequence's), one call writes their K and V rows into two L1
buffers allocated once, two DMAs store them. One L3 stream in and two out per tile.
"""
from __future__ import annotations

from kernel_builder.emit import L1, Module, attr_dict, herd, memref, tile_steps
from kernel_builder.kv_dequant.external import kv_dequant_kernel
from kernel_builder.kv_dequant.plan import plan_kv_dequant
from kernel_builder.kv_quant.reference import row_bytes

KIND = "kv_dequant"


def build(rows: int, kv_heads: int, head_dim: int) -> str:
    plan = plan_kv_dequant(rows, kv_heads, head_dim)
    w, tm, per = plan.width, plan.tile_m, plan.rows_per_tile
    rb = row_bytes(kv_heads, head_dim)
    ext = kv_dequant_kernel(tm, kv_heads, head_dim)
    kv_ty, o_ty = memref([rows, rb], "i8"), memref([rows, w])
    il_ty, ol_ty = memref([tm * rb], "i8", L1), memref([tm * w], "bf16", L1)
    mod = Module(KIND, [kv_ty, o_ty, o_ty])
    mod.declare(ext.symbol, ext.obj, [il_ty, ol_ty, ol_ty])
    attrs = [attr_dict(KIND, {"rows": rows, "kv_heads": kv_heads, "head_dim": head_dim}), f'link_with = "{ext.obj}"']
    h = herd(mod.body, "kvd_herd", (plan.tiles, 1), [(mod.args[0], kv_ty), (mod.args[1], o_ty), (mod.args[2], o_ty)],
             attrs)
    b = h.body
    kv, k, v = h.args
    kl, vl = b.alloc("k_l1", ol_ty), b.alloc("v_l1", ol_ty)   # written by the call
    loop, row = tile_steps(b, h.ids[0], per, tm, plan.steps, [(kl, ol_ty), (vl, ol_ty)])
    il = loop.alloc("kv_l1", il_ty)
    loop.dma(il, il_ty, None, kv, kv_ty, ([row, 0], [tm, rb], [rb, 1]))
    loop.call(ext.symbol, [(il, il_ty), (kl, ol_ty), (vl, ol_ty)])
    loop.dma(k, o_ty, ([row, 0], [tm, w], [w, 1]), kl, ol_ty, None)
    loop.dma(v, o_ty, ([row, 0], [tm, w], [w, 1]), vl, ol_ty, None)
    loop.dealloc(il, il_ty)
    b.dealloc(kl, ol_ty)
    b.dealloc(vl, ol_ty)
    return mod.text()
