"""RoPE (half-split, HF rotate_half): for each position row r and head h, with half = head_dim/2,
c = lut[r, :half], s = lut[r, half:]:
    y[.., :half] = x1*c - x2*s ;  y[.., half:] = x2*c + x1*s      (x1/x2 = first/second half of the head)

MLIR + external C++ (kernel_builder.rope.external.rope_kernel). launch -> segment -> herd [herd, 1], split over
position rows (prefill: tile t owns rows_per_tile consecutive rows) or over heads (decode: tile t owns
heads_per_tile consecutive heads of every row). Per step the tile DMAs a [step_rows, step_heads*head_dim]
block of x and the step_rows LUT rows (both allocated in the innermost loop: ping-ponged; the LUT rows are
re-sent with every block - an L1 buffer loaded outside a loop of a multi-tile herd fails air-dma-to-channel),
one call rotates the block into `y_l1` (allocated once: the call writes it), the block is stored. Offsets are
affine in the tile id and the loop ivs; loops of one trip are not emitted; three L3 streams per tile.
"""
from __future__ import annotations

from kernel_builder.emit import L1, Module, attr_dict, herd, launch, memref, segment
from kernel_builder.rope.external import rope_kernel
from kernel_builder.rope.plan import plan_rope

KIND = "rope"


def build(rows: int, heads: int, head_dim: int) -> str:

    plan = plan_rope(rows, heads, head_dim)
    sr, sh, hd = plan.step_rows, plan.step_heads, head_dim
    ext = rope_kernel(hd, sh, sr)
    width = heads * hd
    x_ty, lut_ty = memref([rows, width]), memref([rows, hd])
    xl_ty, lutl_ty = memref([sr * sh * hd], "bf16", L1), memref([sr * hd], "bf16", L1)
    mod = Module(KIND, [x_ty, lut_ty, x_ty])
    mod.declare(ext.symbol, ext.obj, [xl_ty, lutl_ty, xl_ty])
    types = [x_ty, lut_ty, x_ty]

    la = launch(mod.body, [1, 1], list(zip(mod.args, types)),
                [attr_dict(KIND, {"rows": rows, "heads": heads, "head_dim": hd})])
    seg = segment(la.body, "rope_seg", list(zip(la.args, types)))
    h = herd(seg.body, "rope_herd", (plan.herd, 1), list(zip(seg.args, types)), [f'link_with = "{ext.obj}"'])
    b = h.body
    x, lut, y = h.args

    yl = b.alloc("y_l1", xl_ty)
    if plan.steps > 1:
        b.pin_to_scope(yl, xl_ty)  # written by the call: one copy, outside the ping-ponged loop
    tx = h.ids[0]
    row0 = b.muli(tx, plan.rows_per_tile) if plan.split == "rows" else 0
    col0 = b.muli(tx, plan.heads_per_tile * hd) if plan.split == "heads" else 0
    body, i = b.for_(0, plan.rows_per_tile, sr, "r") if plan.rows_per_tile > sr else (b, 0)
    r = body.addi(row0, i) if plan.rows_per_tile > sr else row0
    step, j = body.for_(0, plan.heads_per_tile * hd, sh * hd, "c") if plan.heads_per_tile > sh else (body, 0)
    c = step.addi(col0, j) if plan.heads_per_tile > sh else col0
    xl = step.alloc("x_l1", xl_ty)
    lutl = step.alloc("lut_l1", lutl_ty)
    block = ([r, c], [sr, sh * hd], [width, 1])
    step.dma(lutl, lutl_ty, None, lut, lut_ty, ([r, 0], [sr, hd], [hd, 1]))
    step.dma(xl, xl_ty, None, x, x_ty, block)
    step.call(ext.symbol, [(xl, xl_ty), (lutl, lutl_ty), (yl, xl_ty)])
    step.dma(y, x_ty, block, yl, xl_ty, None)
    step.dealloc(xl, xl_ty)
    step.dealloc(lutl, lutl_ty)
    b.dealloc(yl, xl_ty)
    return mod.text()
