"""RoPE (half-split, HF rotate_half): for each position row r and head h, with half = head_dim/2,
c = lut[r, :half], s = lut[r, half:]:
    y[.., :half] = x1*c - x2*s ;  y[.., half:] = x2*c + x1*s      (x1/x2 = first/second half of the head)

MLIR + external C++ (kernel_builder.externals.rope_kernel). launch -> segment -> herd [herd, 1]: tiles split
the rows; per row the LUT row is loaded once and the heads are rotated `chunk` heads per external call.
"""
from __future__ import annotations

from .. import planner
from ._emit import L1, Module, attr_dict, herd, launch, memref, segment

KIND = "rope"


def build(rows: int, heads: int, head_dim: int) -> str:
    from .. import externals

    plan = planner.plan_rope(rows, heads, head_dim)
    # The L1 buffer type depends on the heads per call, so the symbol must too (one decl per symbol).
    ext = externals.rope_kernel(head_dim, plan.chunk)
    width = heads * head_dim
    hc = plan.chunk
    x_ty, lut_ty = memref([rows, width]), memref([rows, head_dim])
    xl_ty, lutl_ty = memref([hc * head_dim], "bf16", L1), memref([head_dim], "bf16", L1)
    mod = Module(KIND, [x_ty, lut_ty, x_ty])
    mod.declare(ext.symbol, ext.obj, [xl_ty, lutl_ty, xl_ty, "i32"])
    types = [x_ty, lut_ty, x_ty]

    la = launch(mod.body, [1, 1], list(zip(mod.args, types)),
                [attr_dict(KIND, {"rows": rows, "heads": heads, "head_dim": head_dim})])
    seg = segment(la.body, "rope_seg", list(zip(la.args, types)))
    h = herd(seg.body, "rope_herd", (plan.herd, 1), list(zip(seg.args, types)),
             [f'link_with = "{ext.obj}"'])
    b = h.body
    x, lut, y = h.args
    row0 = b.muli(h.ids[0], plan.units_per_tile)
    rows_loop, i = b.for_(0, plan.units_per_tile, 1, "i")
    r = rows_loop.addi(row0, i)
    lutl = rows_loop.alloc("lut_l1", lutl_ty)
    rows_loop.dma(lutl, lutl_ty, None, lut, lut_ty, ([r, 0], [1, head_dim], [head_dim, 1]))
    heads_loop, c0 = rows_loop.for_(0, width, hc * head_dim, "col")
    xl = heads_loop.alloc("x_l1", xl_ty)
    yl = heads_loop.alloc("y_l1", xl_ty)
    heads_loop.dma(xl, xl_ty, None, x, x_ty, ([r, c0], [1, hc * head_dim], [width, 1]))
    heads_loop.call(ext.symbol, [(xl, xl_ty), (lutl, lutl_ty), (yl, xl_ty), (heads_loop.i32(hc), "i32")])
    heads_loop.dma(y, x_ty, ([r, c0], [1, hc * head_dim], [width, 1]), yl, xl_ty, None)
    heads_loop.dealloc(xl, xl_ty)
    heads_loop.dealloc(yl, xl_ty)
    rows_loop.dealloc(lutl, lutl_ty)
    return mod.text()
