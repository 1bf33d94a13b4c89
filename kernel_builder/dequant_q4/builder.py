"""q4 rows -> bf16 rows (the token's embedding row gathered from the 4-bit vocabulary matrix on the device).

MLIR + external C++ (kernel_builder.dequant_q4.external.dequant_q4_kernel). A bare `air.herd` of one tile (the
stitcher wraps it): the rows [rows, row_bytes] i8 DMA'd L3 -> L1, one call, the bf16 rows [rows, k] stored.
"""
from __future__ import annotations

from kernel_builder.dequant_q4.external import dequant_q4_kernel
from kernel_builder.dequant_q4.plan import plan_dequant_q4
from kernel_builder.emit import L1, Module, attr_dict, herd, memref
from kernel_builder.gemv_q4.format import Q4Layout

KIND = "dequant_q4"


def build(rows: int, k: int, group: int = 32, mins: int = 1) -> str:
    plan_dequant_q4(rows, k, group, mins)
    ext = dequant_q4_kernel(k, group, mins, rows)
    rb = Q4Layout(k, group, bool(mins)).row_bytes
    w_ty, y_ty = memref([rows, rb], "i8"), memref([rows, k])
    wl_ty, yl_ty = memref([rows * rb], "i8", L1), memref([rows * k], "bf16", L1)
    mod = Module(KIND, [w_ty, y_ty])
    mod.declare(ext.symbol, ext.obj, [wl_ty, yl_ty])
    attrs = [attr_dict(KIND, {"rows": rows, "k": k, "group": group, "mins": int(mins)}), f'link_with = "{ext.obj}"']
    h = herd(mod.body, "dq4_herd", (1, 1), [(mod.args[0], w_ty), (mod.args[1], y_ty)], attrs)
    w, y = h.args
    b = h.body
    wl, yl = b.alloc("w_l1", wl_ty), b.alloc("y_l1", yl_ty)
    b.dma(wl, wl_ty, None, w, w_ty, ([0, 0], [rows, rb], [rb, 1]))
    b.call(ext.symbol, [(wl, wl_ty), (yl, yl_ty)])
    b.dma(y, y_ty, ([0, 0], [rows, k], [k, 1]), yl, yl_ty, None)
    b.dealloc(wl, wl_ty)
    b.dealloc(yl, yl_ty)
    return mod.text()
