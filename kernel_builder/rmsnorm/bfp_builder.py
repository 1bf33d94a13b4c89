"""RMSNorm with its output in block float (`rmsnorm.builder.build(..., out="bfp16")`): x bf16 [rows, dim],
w bf16 [dim] -> y i8 [rows/8, 9*dim], the at-rest format of kernel_builder/block_float.py (8x8 blocks of 72 bytes,
block-row major; a block row is 8 rows of x): encode(rmsnorm(x)) with rmsnorm.cc's bf16 values.

launch -> segment -> herd [herd, 1] (kernel_builder.rmsnorm.bfp_plan). The segment stages the weight once in a
memory-tile buffer (as the bf16 builder). Tile t owns 8-row blocks [t*B, (t+1)*B); per block one call of the
kernel per phase and column chunk (phase 0 the sums of squares, carried in acc; phase 1 the normalisation + encoding
into y_l1, the block row's 9*dim bytes), then the block row stored (one contiguous DMA):
- the 8 rows whole in L1 (plan.chunks == 1): one DMA of the 8*dim contiguous elements and the weight, both phases
  on them;
- else a loop over the two phases around a loop over column chunks of C columns: x [8, C] (rows dim apart) and the
  weight chunk per step (one DMA each: each tile receives two streams, the limit of its S2MM channels), so x
  crosses the shim twice.
acc ([8][32] f32) and y_l1 are allocated once at the top of the herd and pinned there (the calls write them; one
copy each, outside the ping-ponged loops); x and w are allocated in their loop (ping-ponged). Offsets are affine
in the tile id and the loop ivs; a loop of one trip is not emitted.
"""
from __future__ import annotations

from kernel_builder.block_float import BLOCK, GROUP_BYTES
from kernel_builder.emit import L1, L2, Module, attr_dict, herd, launch, memref, segment
from kernel_builder.rmsnorm.bfp_external import ACC_ELEMS, rmsnorm_bfp_kernel
from kernel_builder.rmsnorm.bfp_plan import plan_rmsnorm_bfp

KIND = "rmsnorm"


def build_bfp(rows: int, dim: int, eps: float, offset: int = 0) -> str:
    plan = plan_rmsnorm_bfp(rows, dim, offset)
    ext = rmsnorm_bfp_kernel(dim, plan.chunk, offset)
    c = plan.chunk
    x_ty, w_ty, y_ty = memref([rows, dim]), memref([dim]), memref([rows // BLOCK, GROUP_BYTES * dim], "i8")
    xl_ty, wl_ty = memref([BLOCK * c], "bf16", L1), memref([c], "bf16", L1)
    acc_ty, yl_ty = memref([ACC_ELEMS], "f32", L1), memref([GROUP_BYTES * dim], "i8", L1)
    types = [x_ty, w_ty, y_ty]
    mod = Module(KIND, types)
    mod.declare(ext.symbol, ext.obj, [xl_ty, wl_ty, acc_ty, yl_ty, "f32", "i32", "i32"])
    params = {"rows": rows, "dim": dim, "eps": eps}
    if offset:
        params["offset"] = offset
    params["bfp"] = 1
    w2_ty = memref([dim], "bf16", L2)
    la = launch(mod.body, [1, 1], list(zip(mod.args, types)), [attr_dict(KIND, params)])
    seg = segment(la.body, "rmsnorm_seg", list(zip(la.args, types)))
    sb = seg.body
    w2 = sb.alloc("w_l2", w2_ty)
    sb.dma(w2, w2_ty, None, seg.args[1], w_ty, ([0], [dim], [1]))
    h = herd(sb, "rmsnorm_herd", (plan.herd, 1), [(seg.args[0], x_ty), (w2, w2_ty), (seg.args[2], y_ty)],
             [f'link_with = "{ext.obj}"'])
    sb.dealloc(w2, w2_ty)
    b = h.body
    x, w, y = h.args
    acc, yl = b.alloc("acc_l1", acc_ty), b.alloc("y_l1", yl_ty)
    if plan.blocks_per_tile > 1 or plan.chunks > 1:
        b.pin_to_scope(acc, acc_ty)   # carried from phase 0 to phase 1 (and across chunks): one copy
        b.pin_to_scope(yl, yl_ty)     # written by the calls: one copy
    first = b.muli(h.ids[0], plan.blocks_per_tile)
    blk_loop, i = b.for_(0, plan.blocks_per_tile, 1, "blk") if plan.blocks_per_tile > 1 else (b, 0)
    blk = blk_loop.addi(first, i) if plan.blocks_per_tile > 1 else first

    def step(lb, phase, c0) -> None:
        lb.call(ext.symbol, [(xl, xl_ty), (wl, wl_ty), (acc, acc_ty), (yl, yl_ty), (lb.f32(eps), "f32"),
                             (phase, "i32"), (c0, "i32")])

    if plan.chunks == 1:
        lb = blk_loop
        xl, wl = lb.alloc("x_l1", xl_ty), lb.alloc("w_l1", wl_ty)
        lb.dma(wl, wl_ty, None, w, w2_ty, ([0], [dim], [1]))
        lb.dma(xl, xl_ty, None, x, x_ty, ([lb.muli(blk, BLOCK * dim)], [BLOCK * dim], [1]))
        step(lb, lb.i32(0), lb.i32(0))
        step(lb, lb.i32(1), lb.i32(0))
    else:
        ph_loop, ph = blk_loop.for_(0, 2, 1, "ph")
        lb, c0 = ph_loop.for_(0, dim, c, "c")
        xl, wl = lb.alloc("x_l1", xl_ty), lb.alloc("w_l1", wl_ty)
        lb.dma(wl, wl_ty, None, w, w2_ty, ([c0], [c], [1]))
        lb.dma(xl, xl_ty, None, x, x_ty, ([lb.muli(blk, BLOCK), c0], [BLOCK, c], [dim, 1]))
        step(lb, lb.value("ph_i32", f"arith.index_cast {lb.idx(ph)} : index to i32"),
             lb.value("c0_i32", f"arith.index_cast {lb.idx(c0)} : index to i32"))
    lb.dealloc(xl, xl_ty)
    lb.dealloc(wl, wl_ty)
    blk_loop.dma(y, y_ty, ([blk_loop.muli(blk, GROUP_BYTES * dim)], [GROUP_BYTES * dim], [1]), yl, yl_ty, None)
    b.dealloc(acc, acc_ty)
    b.dealloc(yl, yl_ty)
    return mod.text()
