"""GEMV: y[0, i] = sum_k w[i, k] * x[0, k]   (w row-major in HF (out, in) layout; f32 accumulate).

MLIR + external C++ (kernel_builder.externals.gemv_kernel). launch [launch_m, 1] -> segment -> herd [herd_m, 1];
in launch iteration l tile t owns output rows [r0, r0 + R) with r0 = (l*herd_m + t)*R (R = rows per tile) and keeps
them in an L1 buffer `y_l1` allocated once at the top of the herd, stored to L3 with ONE DMA after its loops
(R*2 bytes: whole 32-bit words at every shape). launch_m > 1 only for very tall matrices (see planner.GemvPlan).
The segment stages x once per launch iteration in a memory-tile buffer (`x_l2 [k] <- x`, one shim transfer).
Per step (row block i of tile_m rows, K chunk k0 of k_chunk elements) the tile allocates, DMAs and consumes:

    w_l1 [tile_m, k_chunk] <- w[r0 + i, k0]    (its own rows: one shim stream per tile)
    x_l1 [k_chunk]         <- x_l2[k0]         (the same bytes for every tile: one memory-tile broadcast)
    call mv(w_l1, x_l1, acc_l1, y_l1, i, k0)   (f32 partial sums in acc_l1 across K chunks; the last chunk
                                                writes bf16 into y_l1[i : i+tile_m])

x is re-sent inside the loop on purpose: an L1 buffer loaded once outside a loop of a multi-tile herd and read
inside it fails mlir-air's air-dma-to-channel ("operand does not dominate this use"). It is re-sent from L2, not
from L3: a shim DMA task repeats at most 256 times (repeat_count <= 255, and the lowering folds the repeats of
every launch iteration into one task), a memory-tile BD chain repeats without limit. Both streamed buffers are
allocated inside the innermost loop and first written by a DMA, so aircc's ping-pong transform doubles them
(planner.GemvPlan counts the copies); acc_l1 and y_l1, which the call writes, are allocated once outside the
loops (acc_l1 pinned there by a store before the loops, `Block.pin_to_scope`: mlir-air's air-fuse-alloc-dealloc
would move it into the K loop, where the pinned mlir-air's ping-pong transform alternated two copies and broke
the partial sums carried from chunk to chunk - seen in the real lowering's core code). Loops of one trip are not
emitted. All offsets are affine in the tile id and the loop ivs.
"""
from __future__ import annotations

from .. import planner
from ._emit import L1, L2, Module, attr_dict, herd, launch, memref, segment

KIND = "gemv"


def build(m: int, k: int) -> str:
    from .. import externals  # lazy: the registry is owned by another module

    plan = planner.plan_gemv(m, k)
    rows, tm, kc = plan.rows_per_tile, plan.tile_m, plan.k_chunk
    ext = externals.gemv_kernel(k, kc, tm, rows)
    w_ty, x_ty, y_ty = memref([m, k]), memref([1, k]), memref([1, m])
    wl_ty, xl_ty = memref([tm, kc], "bf16", L1), memref([kc], "bf16", L1)
    acc_ty, yl_ty = memref([tm], "f32", L1), memref([rows], "bf16", L1)
    mod = Module(KIND, [w_ty, x_ty, y_ty])
    mod.declare(ext.symbol, ext.obj, [wl_ty, xl_ty, acc_ty, yl_ty, "i32", "i32"])
    types = [w_ty, x_ty, y_ty]

    x2_ty = memref([k], "bf16", L2)
    la = launch(mod.body, [plan.launch_m, 1], list(zip(mod.args, types)), [attr_dict(KIND, {"m": m, "k": k})])
    extra = [(la.ids[0], "index")] if plan.launch_m > 1 else []  # the launch iteration reaches the herd
    seg = segment(la.body, "gemv_seg", list(zip(la.args, types)) + extra)
    sb = seg.body
    x2 = sb.alloc("x_l2", x2_ty)
    sb.dma(x2, x2_ty, None, seg.args[1], x_ty, ([0, 0], [1, k], [k, 1]))
    h = herd(sb, "gemv_herd", (plan.herd_m, 1),
             [(seg.args[0], w_ty), (x2, x2_ty), (seg.args[2], y_ty)] + [(v, "index") for v in seg.args[3:]],
             [f'link_with = "{ext.obj}"'])
    sb.dealloc(x2, x2_ty)
    w, x, y = h.args[:3]
    lx = h.args[3] if plan.launch_m > 1 else None
    b = h.body

    acc = b.alloc("acc_l1", acc_ty)
    yl = b.alloc("y_l1", yl_ty)
    if plan.row_steps > 1 or plan.k_steps > 1:
        b.pin_to_scope(acc, acc_ty)  # f32 partial sums carried across steps: one copy, not ping-ponged
    tile = b.addi(b.muli(lx, plan.herd_m), h.ids[0]) if plan.launch_m > 1 else h.ids[0]
    row0 = b.muli(tile, rows)
    body, i = (b.for_(0, rows, tm, "i") if plan.row_steps > 1 else (b, 0))
    r = body.addi(row0, i) if plan.row_steps > 1 else row0
    step, k0 = (body.for_(0, k, kc, "k0") if plan.k_steps > 1 else (body, 0))
    wl = step.alloc("w_l1", wl_ty)
    xl = step.alloc("x_l1", xl_ty)
    step.dma(xl, xl_ty, None, x, x2_ty, ([k0], [kc], [1]))
    step.dma(wl, wl_ty, None, w, w_ty, ([r, k0], [tm, kc], [k, 1]))
    row_i32 = step.value("row_i32", f"arith.index_cast {step.idx(i)} : index to i32") if plan.row_steps > 1 \
        else step.i32(0)
    k0_i32 = step.value("k0_i32", f"arith.index_cast {step.idx(k0)} : index to i32") if plan.k_steps > 1 \
        else step.i32(0)
    step.call(ext.symbol, [(wl, wl_ty), (xl, xl_ty), (acc, acc_ty), (yl, yl_ty), (row_i32, "i32"), (k0_i32, "i32")])
    step.dealloc(wl, wl_ty)
    step.dealloc(xl, xl_ty)
    b.dma(y, y_ty, ([0, row0], [1, rows], [m, 1]), yl, yl_ty, None)
    b.dealloc(acc, acc_ty)
    b.dealloc(yl, yl_ty)
    return mod.text()
