"""4-bit -> bf16 dequantization of a weight: y[m, k] = dequantize(w) (w u8 [m, row_bytes] in the q4 row layout,
kernel_builder/gemv_q4/format.py). Prefill with `--weights q4` runs it before each GEMM into a scratch shared by
every layer, so the device holds the 4-bit weights only (docs/quantization.md, "Prefill").

MLIR + external C++ (external_kernels/dequant_q4.cc, AIE2P vector path). Emits a bare `air.herd` (the stitcher
wraps it), the data movement of the elementwise kernels (kernel_builder/emit.py, elementwise_body): tile t of
the [tiles, 1] herd owns rows [t*R, (t+1)*R); per step tile_m whole q4 rows (codes, scales and mins of a row are
one contiguous run) are DMA'd L3 -> L1 (allocated in the loop: aircc's ping-pong doubles them), one call writes
their bf16 rows into `y_l1` (allocated once), which is stored. Offsets are affine in the tile id and the loop iv;
two L3 streams per tile.
"""
from __future__ import annotations

from kernel_builder.dequant_q4.external import dequant_q4_kernel
from kernel_builder.dequant_q4.plan import plan_dequant_q4
from kernel_builder.emit import L1, Module, attr_dict, herd, memref, tile_steps

KIND = "dequant_q4"


def build(m: int, k: int, group: int = 32, mins: int = 1) -> str:
    plan = plan_dequant_q4(m, k, group, mins)
    rb, tm, rows = plan.layout.row_bytes, plan.tile_m, plan.rows_per_tile
    ext = dequant_q4_kernel(k, group, mins, tm)
    w_ty, y_ty = memref([m, rb], "i8"), memref([m, k])
    wl_ty, yl_ty = memref([tm * rb], "i8", L1), memref([tm * k], "bf16", L1)
    mod = Module(KIND, [w_ty, y_ty])
    mod.declare(ext.symbol, ext.obj, [wl_ty, yl_ty])
    attrs = [attr_dict(KIND, {"m": m, "k": k, "group": group, "mins": int(mins)}), f'link_with = "{ext.obj}"']
    h = herd(mod.body, "dqq4_herd", (plan.tiles, 1), [(mod.args[0], w_ty), (mod.args[1], y_ty)], attrs)
    b = h.body
    w, y = h.args
    yl = b.alloc("y_l1", yl_ty)   # written by the call
    loop, row = tile_steps(b, h.ids[0], rows, tm, plan.steps, [(yl, yl_ty)])
    wl = loop.alloc("w_l1", wl_ty)
    loop.dma(wl, wl_ty, None, w, w_ty, ([row, 0], [tm, rb], [rb, 1]))
    loop.call(ext.symbol, [(wl, wl_ty), (yl, yl_ty)])
    loop.dma(y, y_ty, ([row, 0], [tm, k], [k, 1]), yl, yl_ty, None)
    loop.dealloc(wl, wl_ty)
    b.dealloc(yl, yl_ty)
    return mod.text()
