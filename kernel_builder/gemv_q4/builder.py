"""GEMV on 4-bit weights: y[0, i] = sum_k dequant(w)[i, k] * x[0, k]; w is u8 [m, row_bytes] in the q4 row layout
(kernel_builder.gemv_q4.format, docs/quantization.md), dequantized in the core.

The data movement is the gemv kernel's (kernel_builder/gemv/builder.py): launch [1, 1] -> segment -> herd
[herd_x, herd_y], each tile one stream straight from L3 on its own channel `@gemvq4_in[tx, ty]`: x [k] first (kept
in L1), then its rows [r0, r0 + R) of w, one contiguous run of R * row_bytes bytes (codes, scales and mins of a
row travel together), received tile_m rows per step into a ping-ponged `w_l1`; the tile keeps its R outputs in
`y_l1` and stores them to L3 with one DMA. Like mlir-air's fused Q4 decode example, the packed weights (not a
dequantized copy) are what crosses the shim: a quarter of the bf16 bytes plus the scales.
"""
from __future__ import annotations

from kernel_builder.emit import L1, Module, attr_dict, herd, launch, memref, segment
from kernel_builder.gemv.builder import put_x_then_rows, tile_row0
from kernel_builder.gemv_q4.external import gemv_q4_kernel, swiglu_symbol
from kernel_builder.gemv_q4.plan import plan_gemv_q4

KIND = "gemv_q4"
CHANNEL = "gemvq4_in"


def build(m: int, k: int, group: int = 32, mins: int = 1, bits: int = 4, bias: bool = False,
          swiglu: bool = False) -> str:
    """bits=8: the same GEMV on 8-bit codes (GGUF Q8_0's vocabulary matrix). bias: the `gemv_q4_bias` kernel
    (arguments w, x, b [1, m], y): each tile's bias rows follow x on its stream, in x's one transfer. swiglu: the
    `gemv_q4_swiglu` kernel (arguments w_gate, w_up, x, y): each tile's stream carries x, its R gate rows, then
    its R up rows (one loop of 2R rows into y_l1 [2R]), the tile computes silu(gate) * up into act_l1 [R] and
    stores those R outputs (kernel_builder.gemv_q4_swiglu)."""
    plan = plan_gemv_q4(m, k, group, mins, bits, bias, swiglu)
    rb, rows, tm = plan.layout.row_bytes, plan.rows_per_tile, plan.tile_m
    hx, hy = plan.herd_x, plan.herd_y
    ext = gemv_q4_kernel(k, group, mins, tm, plan.stream_rows, bits, bias, swiglu)
    w_ty, x_ty, y_ty, b_ty = memref([m, rb], "i8"), memref([1, k]), memref([1, m]), memref([1, m])
    wl_ty, xl_ty = memref([tm * rb], "i8", L1), memref([k + rows * bias], "bf16", L1)
    yl_ty, al_ty = memref([plan.stream_rows], "bf16", L1), memref([rows], "bf16", L1)
    types = [w_ty, w_ty, x_ty, y_ty] if swiglu else [w_ty, x_ty, b_ty, y_ty] if bias else [w_ty, x_ty, y_ty]
    kind = "gemv_q4_swiglu" if swiglu else "gemv_q4_bias" if bias else KIND
    mod = Module(kind, types)
    mod.declare(ext.symbol, ext.obj, [wl_ty, xl_ty, yl_ty, "i32"])
    if swiglu:
        mod.declare(swiglu_symbol(ext), ext.obj, [yl_ty, al_ty])
    ch = mod.channel(CHANNEL, [hx, hy])
    la = launch(mod.body, [1, 1], list(zip(mod.args, types)),
                [attr_dict(kind, {"m": m, "k": k, "group": group, "mins": int(mins),
                                  **({"bits": bits} if bits != 4 else {})})])
    lw, lxv, ly = la.args[0], la.args[1 + swiglu], la.args[-1]
    lb = la.body
    put_x_then_rows(lb, ch, (hx, hy), rows, (lxv, x_ty, k), (lw, w_ty, rb), (la.args[2], b_ty, m) if bias else None,
                    (la.args[1], w_ty, rb) if swiglu else None)
    seg = segment(lb, "gemvq4_seg", [(ly, y_ty)])
    h = herd(seg.body, "gemvq4_herd", (hx, hy), [(seg.args[0], y_ty)], [f'link_with = "{ext.obj}"'])
    tx, ty = h.ids
    y = h.args[0]
    b = h.body
    yl = b.alloc("y_l1", yl_ty)
    xl = b.alloc("x_l1", xl_ty)
    b.channel_get(ch, [tx, ty], xl, xl_ty, None)
    row0 = tile_row0(b, tx, ty, hy, rows)
    step, i = (b.for_(0, plan.stream_rows, tm, "i") if plan.steps > 1 else (b, 0))
    wl = step.alloc("w_l1", wl_ty)
    step.channel_get(ch, [tx, ty], wl, wl_ty, None)
    row_i32 = step.value("row_i32", f"arith.index_cast {step.idx(i)} : index to i32") if plan.steps > 1 \
        else step.i32(0)
    step.call(ext.symbol, [(wl, wl_ty), (xl, xl_ty), (yl, yl_ty), (row_i32, "i32")])
    step.dealloc(wl, wl_ty)
    out = yl
    if swiglu:
        out = b.alloc("act_l1", al_ty)
        b.call(swiglu_symbol(ext), [(yl, yl_ty), (out, al_ty)])
    b.dma(y, y_ty, ([0, row0], [1, rows], [m, 1]), out, al_ty if swiglu else yl_ty, None)
    b.dealloc(xl, xl_ty)
    b.dealloc(yl, yl_ty)
    if swiglu:
        b.dealloc(out, al_ty)
    return mod.text()
