"""GEMV: y[0, i] = sum_k w[i, k] * x[0, k]   (w row-major in HF (out, in) layout; f32 accumulate).

MLIR + external C++ (kernel_builder.gemv.external.gemv_kernel). launch [1, 1] -> segment -> herd [herd_x, herd_y]
(gemv.plan.GemvPlan: up to 16 tiles, [8, 2]); tile (tx, ty) is number t = tx*herd_y + ty, owns output rows
[r0, r0 + R) with r0 = t*R (R = rows per tile) and keeps them in an L1 buffer `y_l1` allocated once at the top
of the herd, stored to L3 with ONE DMA after its loops (R*2 bytes: whole 32-bit words at every shape).

Every tile has one stream straight from L3, channel `@gemv_in[tx, ty]` (a circuit flow of its own: one shim
MM2S channel per tile, all 16 of the array at [8, 2]). The launch body puts on it, in this order,

    x  [k]                   (the same vector for every tile: 16 small reads of x)
    w  rows [r0, r0 + R)     (one contiguous run: whole rows, or one row per step when K is chunked)

so the shim streams them one after the other on the one channel (puts on one L3 channel index share one shim
stream). The tile gets x once into `x_l1` (whole, kept for all steps), then per step (row block i of
tile_m rows, K chunk k0 of k_chunk elements) the next `w_l1 [tile_m, k_chunk]` block and calls

    mv(w_l1, x_l1, acc_l1, y_l1, i, k0)   (f32 partial sums in acc_l1 across K chunks; the last chunk writes
                                           bf16 into y_l1[i : i+tile_m]; the kernel reads x_l1[k0 : k0+k_chunk])

No memory tile is involved. w_l1 is allocated inside the innermost loop and first written by the channel get, so
aircc's ping-pong transform doubles it (gemv.plan.GemvPlan counts the copies); x_l1 (filled before the loops),
acc_l1 and y_l1 (written by the call) are allocated once at the top of the herd (acc_l1 pinned there by a
store, `Block.pin_to_scope`: mlir-air's air-fuse-alloc-dealloc would move a buffer used only inside a loop into
it, and the ping-pong copies would break the partial sums carried from chunk to chunk). Loops of one trip are
not emitted. All offsets are affine in the tile ids and the loop ivs (the launch-level ones constant).

With `bias` (the `gemv_bias` kernel: y = W x + b, module arguments w, x, b [1, m], y) each tile's stream carries
its bias rows b[r0, r0 + R) right after x, and the tile takes both with its ONE x transfer into `x_l1 [k + R]`
(a third transfer into a core would need a third S2MM channel: a core has 2); the kernel adds them to the f32
sums of the last K chunk before the one rounding (external_kernels/gemv.cc, GEMV_BIAS).
"""
from __future__ import annotations

from kernel_builder.emit import L1, Module, attr_dict, herd, launch, memref, segment
from kernel_builder.gemv.external import gemv_kernel
from kernel_builder.gemv.plan import plan_gemv

KIND = "gemv"
CHANNEL = "gemv_in"


def build(m: int, k: int, bias: bool = False) -> str:

    plan = plan_gemv(m, k, bias)
    ext = gemv_kernel(k, plan.k_chunk, plan.tile_m, plan.rows_per_tile, bias)
    return emit(plan, ext, "gemv_bias" if bias else KIND, (CHANNEL, "gemv_seg", "gemv_herd"),
                (memref([m, k]), k, 1), memref([plan.tile_m, plan.k_chunk], "bf16", L1))


def emit(plan, ext, kind: str, names: tuple[str, str, str], w, wl_ty: str) -> str:
    """The GEMV module of `plan` (gemv.plan.GemvPlan) calling `ext` per step: `names` = (channel, segment, herd);
    `w` = (the weight argument's memref type, its row length in elements, output rows per weight row: 1 for bf16
    rows, 8 for block-float block rows); `wl_ty` the L1 type of one step's weight block (gemv, gemv_bias,
    gemv_bfp, gemv_bfp_bias)."""
    m, k, bias = plan.m, plan.k, plan.bias
    rows, tm, kc = plan.rows_per_tile, plan.tile_m, plan.k_chunk
    hx, hy = plan.herd_x, plan.herd_y
    w_ty, w_row, w_group = w
    x_ty, y_ty, b_ty = memref([1, k]), memref([1, m]), memref([1, m])
    xl_ty = memref([k + rows * bias], "bf16", L1)
    acc_ty, yl_ty = memref([tm], "f32", L1), memref([rows], "bf16", L1)
    types = [w_ty, x_ty, b_ty, y_ty] if bias else [w_ty, x_ty, y_ty]
    mod = Module(kind, types)
    mod.declare(ext.symbol, ext.obj, [wl_ty, xl_ty, acc_ty, yl_ty, "i32", "i32"])
    ch = mod.channel(names[0], [hx, hy])

    la = launch(mod.body, [1, 1], list(zip(mod.args, types)), [attr_dict(kind, {"m": m, "k": k})])
    lw, lxv, ly = la.args[0], la.args[1], la.args[-1]
    lb = la.body
    # ---- launch: per tile, x (then its bias rows) then its weight rows on the tile's own channel (one shim stream
    # each)
    put_x_then_rows(lb, ch, (hx, hy), rows, (lxv, x_ty, k), (lw, w_ty, w_row), (la.args[2], b_ty, m) if bias else None,
                    w_group=w_group)

    # ---- segment: the herd; its tiles store their rows straight to L3
    seg = segment(lb, names[1], [(ly, y_ty)])
    h = herd(seg.body, names[2], (hx, hy), [(seg.args[0], y_ty)], [f'link_with = "{ext.obj}"'])
    tx, ty = h.ids
    y = h.args[0]
    b = h.body

    acc = b.alloc("acc_l1", acc_ty)
    yl = b.alloc("y_l1", yl_ty)
    xl = b.alloc("x_l1", xl_ty)
    if plan.row_steps > 1 or plan.k_steps > 1:
        b.pin_to_scope(acc, acc_ty)  # f32 partial sums carried across steps: one copy, not ping-ponged
    b.channel_get(ch, [tx, ty], xl, xl_ty, None)
    row0 = tile_row0(b, tx, ty, hy, rows)
    body, i = (b.for_(0, rows, tm, "i") if plan.row_steps > 1 else (b, 0))
    step, k0 = (body.for_(0, k, kc, "k0") if plan.k_steps > 1 else (body, 0))
    wl = step.alloc("w_l1", wl_ty)
    step.channel_get(ch, [tx, ty], wl, wl_ty, None)
    row_i32 = step.value("row_i32", f"arith.index_cast {step.idx(i)} : index to i32") if plan.row_steps > 1 \
        else step.i32(0)
    k0_i32 = step.value("k0_i32", f"arith.index_cast {step.idx(k0)} : index to i32") if plan.k_steps > 1 \
        else step.i32(0)
    step.call(ext.symbol, [(wl, wl_ty), (xl, xl_ty), (acc, acc_ty), (yl, yl_ty), (row_i32, "i32"), (k0_i32, "i32")])
    step.dealloc(wl, wl_ty)
    b.dma(y, y_ty, ([0, row0], [1, rows], [m, 1]), yl, yl_ty, None)
    b.dealloc(xl, xl_ty)
    b.dealloc(acc, acc_ty)
    b.dealloc(yl, yl_ty)
    return mod.text()


def put_x_then_rows(lb, ch: str, herd_shape: tuple[int, int], rows: int, x, w, bias=None, w2=None,
                    w_group: int = 1) -> None:
    """The launch body of a GEMV (gemv, gemv_q4): per tile (tx, ty), number t = tx*herd_y + ty, on its own
    channel: the whole x, (with `bias`: the tile's bias elements [t*rows, (t+1)*rows), which the tile takes in
    x's transfer,) then its `rows` rows [t*rows, (t+1)*rows) of w as one contiguous run (with `w2`, a second
    matrix of w's shape: then its rows [t*rows, (t+1)*rows) too, gemv_q4_swiglu's up rows after the gate rows).
    `x`, `w`, `w2`: (launch value, memref type, row length in elements); `bias`: (launch value, memref type
    [1, m], m). `w_group`: output rows per row of w (block float: 8, one block row holds 8 weight rows)."""
    hx, hy = herd_shape
    (xv, x_ty, k), (wv, w_ty, row) = x, w
    for tx in range(hx):
        for ty in range(hy):
            r0 = (tx * hy + ty) * rows
            lb.channel_put(ch, [tx, ty], xv, x_ty, ([0, 0], [1, k], [k, 1]))
            if bias is not None:
                bv, b_ty, m = bias
                lb.channel_put(ch, [tx, ty], bv, b_ty, ([0, r0], [1, rows], [m, 1]))
            lb.channel_put(ch, [tx, ty], wv, w_ty, ([r0 // w_group, 0], [rows // w_group, row], [row, 1]))
            if w2 is not None:
                lb.channel_put(ch, [tx, ty], w2[0], w2[1], ([r0, 0], [rows, w2[2]], [w2[2], 1]))


def tile_row0(b, tx, ty, hy: int, rows: int):
    """In the herd body: the first output row of tile (tx, ty), (tx*hy + ty) * rows."""
    tile = b.addi(b.muli(tx, hy), ty) if hy > 1 else tx
    return b.muli(tile, rows)
