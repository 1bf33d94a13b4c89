"""Bias add: y[r, :] = x[r, :] + b (a [1, dim] bias row broadcast over the rows; bf16 in/out, f32 add, RNE) - the
bias epilogue of a projection with a bias (a stitched launch after the GEMV / GEMM that computes x).

MLIR + external C++ (kernel_builder.bias_add.external.bias_add_kernel: add.cc with n = dim, one row per call).
launch -> segment -> herd [herd, 1], the rmsnorm kernel's weight pattern: the segment stages the bias row once in a
memory-tile buffer; tile t owns a contiguous range of rows and per step DMAs one row of x (L3) and the bias row
(from L2: the same bytes for every tile, one broadcast, re-sent every step as rmsnorm's weight is), calls the kernel into `y_l1` (allocated once: the call writes it) and stores the row. Offsets are affine in the tile id and
the loop iv; a loop of one trip is not emitted.
"""
from __future__ import annotations

from kernel_builder.bias_add.external import bias_add_kernel
from kernel_builder.bias_add.plan import plan_bias_add
from kernel_builder.emit import L1, L2, Module, attr_dict, herd, launch, memref, segment, tile_steps

KIND = "bias_add"


def build(rows: int, dim: int) -> str:
    plan = plan_bias_add(rows, dim)
    ext = bias_add_kernel(dim)
    x_ty, b_ty = memref([rows, dim]), memref([1, dim])
    l1_ty, b2_ty = memref([dim], "bf16", L1), memref([dim], "bf16", L2)
    mod = Module(KIND, [x_ty, b_ty, x_ty])
    mod.declare(ext.symbol, ext.obj, [l1_ty, l1_ty, l1_ty])
    types = [x_ty, b_ty, x_ty]
    la = launch(mod.body, [1, 1], list(zip(mod.args, types)), [attr_dict(KIND, {"rows": rows, "dim": dim})])
    seg = segment(la.body, "bias_add_seg", list(zip(la.args, types)))
    sb = seg.body
    b2 = sb.alloc("b_l2", b2_ty)
    sb.dma(b2, b2_ty, None, seg.args[1], b_ty, ([0, 0], [1, dim], [dim, 1]))
    h = herd(sb, "bias_add_herd", (plan.herd, 1), [(seg.args[0], x_ty), (b2, b2_ty), (seg.args[2], x_ty)],
             [f'link_with = "{ext.obj}"'])
    sb.dealloc(b2, b2_ty)
    b = h.body
    x, bias, y = h.args
    per_tile = plan.units_per_tile          # rows of a tile; one row per step
    yl = b.alloc("y_l1", l1_ty)   # written by the call
    loop, row = tile_steps(b, h.ids[0], per_tile, 1, plan.steps, [(yl, l1_ty)])
    xl = loop.alloc("x_l1", l1_ty)
    bl = loop.alloc("b_l1", l1_ty)
    loop.dma(bl, l1_ty, None, bias, b2_ty, ([0], [dim], [1]))
    loop.dma(xl, l1_ty, None, x, x_ty, ([row, 0], [1, dim], [dim, 1]))
    loop.call(ext.symbol, [(xl, l1_ty), (bl, l1_ty), (yl, l1_ty)])
    loop.dma(y, x_ty, ([row, 0], [1, dim], [dim, 1]), yl, l1_ty, None)
    loop.dealloc(xl, l1_ty)
    loop.dealloc(bl, l1_ty)
    b.dealloc(yl, l1_ty)
    return mod.text()
