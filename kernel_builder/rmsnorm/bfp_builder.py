"""RMSNorm with its output in block float (`rmsnorm.builder.build(..., out="bfp16")`): x bf16 [rows, dim],
w bf16 [dim] -> y i8 [rows/8, 9*dim], the at-rest format of kernel_builder/block_float.py (8x8 blocks of 72 bytes,
block-row major; a block row is 8 rows of x): encode(rmsnorm(x)) with rmsnorm.cc's bf16 values.

launch -> segment -> herd [herd, 1] (kernel_builder.rmsnorm.bfp_plan). The segment stages the weight once in a
memory-tile buffer (as the bf16 builder). Tile t owns 8-row blocks [t*B, (t+1)*B); the kernel runs per column chunk
in two phases (phase 0 the sums of squares, carried in st, the last chunk keeping r of the block's rows; phase 1
the normalisation + encoding into y_l1):
- the 8 rows whole in L1 (plan.chunks == 1): per block one DMA of its 8*dim contiguous elements and the weight,
  both phases on them, the block row's 9*dim bytes stored; x and w ping-ponged in the block loop, or with
  plan.single one copy each allocated at the top of the herd and pinned there (the 8 rows fit only so);
- the 8 whole rows in one pinned copy, normalised in chunks (plan.xwhole): per block one DMA of the rows, then per
  chunk the weight chunk (ping-ponged) and one phase-1 call (the first chunk's call sums the rows first), the chunk's
  9*C bytes stored;
- else phase -> block -> chunk loops: x [8, C] (rows dim apart) and the weight chunk per step (one DMA each: each
  tile receives two streams, its S2MM channels), the chunk's 9*C bytes stored per step (phase 0 stores zeros that
  phase 1 overwrites). The phase loop outermost keeps x's shim pattern to four dimensions (chunk columns, 8 rows,
  chunks, blocks) repeated twice: with the phase inside the block loop the real lowering unrolled blocks x phases
  into shim BDs and ran out of them ("Allocator exhausted available buffer descriptor IDs" at 1024-2048 rows).
st and y_l1 are allocated once at the top of the herd and pinned there (the calls write them; one copy each,
outside the ping-ponged loops); x and w are allocated in their loop (ping-ponged). Offsets are affine in the tile id
and the loop ivs; a loop of one trip is not emitted.
"""
from __future__ import annotations

from dataclasses import dataclass

from kernel_builder.block_float import BLOCK, GROUP_BYTES
from kernel_builder.emit import L1, L2, Module, attr_dict, herd, launch, memref, segment
from kernel_builder.rmsnorm.bfp_external import st_elems
from kernel_builder.rmsnorm.bfp_plan import plan_rmsnorm_bfp

KIND = "rmsnorm"


@dataclass(frozen=True)
class _Tile:
    """What a tile's loops need: the herd's operands and the L1 buffers allocated at its top, with their types."""
    x: str
    w2: str
    st: str
    yl: str
    x_ty: str
    w2_ty: str
    xl_ty: str
    wl_ty: str
    st_ty: str
    yl_ty: str

    def call(self, lb, symbol: str, xl: str, wl: str, eps: float, ints: list) -> None:
        lb.call(symbol, [(xl, self.xl_ty), (wl, self.wl_ty), (self.st, self.st_ty), (self.yl, self.yl_ty),
                         (lb.f32(eps), "f32")] + [(v, "i32") for v in ints])


def build_bfp(rows: int, dim: int, eps: float, offset: int = 0) -> str:
    plan = plan_rmsnorm_bfp(rows, dim, offset)
    ext = plan.kernel()
    c = plan.chunk
    x_ty, w_ty, y_ty = memref([rows, dim]), memref([dim]), memref([rows // BLOCK, GROUP_BYTES * dim], "i8")
    xl_ty, wl_ty = memref([BLOCK * (dim if plan.xwhole else c)], "bf16", L1), memref([c], "bf16", L1)
    st_ty, yl_ty = memref([st_elems(plan.kernel_blocks)], "f32", L1), memref([GROUP_BYTES * c], "i8", L1)
    types = [x_ty, w_ty, y_ty]
    mod = Module(KIND, types)
    mod.declare(ext.symbol, ext.obj, [xl_ty, wl_ty, st_ty, yl_ty, "f32", "i32", "i32", "i32"])
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
    st, yl = b.alloc("st_l1", st_ty), b.alloc("y_l1", yl_ty)
    if plan.blocks_per_tile > 1 or plan.chunks > 1:
        b.pin_to_scope(st, st_ty)     # carried from phase 0 to phase 1 (and across chunks): one copy
        b.pin_to_scope(yl, yl_ty)     # written by the calls: one copy
    first = b.muli(h.ids[0], plan.blocks_per_tile)
    tile = _Tile(x, w, st, yl, x_ty, w2_ty, xl_ty, wl_ty, st_ty, yl_ty)
    body = _whole_rows if plan.chunks == 1 else _xwhole if plan.xwhole else _two_passes
    lb, y_off, owner, xl, wl = body(b, plan, ext.symbol, first, tile, eps)
    lb.dma(y, y_ty, ([y_off], [GROUP_BYTES * c], [1]), yl, yl_ty, None)
    (b if plan.xwhole else owner).dealloc(xl, xl_ty)
    owner.dealloc(wl, wl_ty)
    b.dealloc(st, st_ty)
    b.dealloc(yl, yl_ty)
    return mod.text()


def _whole_rows(b, plan, symbol: str, first: str, t: _Tile, eps: float):
    """Per block: its 8 rows (8*dim contiguous elements) and the weight, both phases on them. Returns the block
    loop's body, the block row's offset in y, the block owning x_l1 / w_l1 and those two."""
    dim, many = plan.dim, plan.blocks_per_tile > 1
    if plan.single:               # one copy each, at the top of the herd (pinned: not moved into the loop)
        xl, wl = b.alloc("x_l1", t.xl_ty), b.alloc("w_l1", t.wl_ty)
        b.pin_to_scope(xl, t.xl_ty)
        b.pin_to_scope(wl, t.wl_ty)
    lb, i = b.for_(0, plan.blocks_per_tile, 1, "blk") if many else (b, 0)
    blk = lb.addi(first, i) if many else first
    if not plan.single:
        xl, wl = lb.alloc("x_l1", t.xl_ty), lb.alloc("w_l1", t.wl_ty)
    lb.dma(wl, t.wl_ty, None, t.w2, t.w2_ty, ([0], [dim], [1]))
    lb.dma(xl, t.xl_ty, None, t.x, t.x_ty, ([lb.muli(blk, BLOCK * dim)], [BLOCK * dim], [1]))
    for phase in (0, 1):
        t.call(lb, symbol, xl, wl, eps, [lb.i32(phase), lb.i32(0), lb.i32(0)])
    return lb, lb.muli(blk, GROUP_BYTES * dim), (b if plan.single else lb), xl, wl


def _two_passes(b, plan, symbol: str, first: str, t: _Tile, eps: float):
    """phase -> block -> chunk loops; per step x [8, chunk] (rows dim apart) and the weight chunk. Returns the chunk
    loop's body, the chunk's offset in y, the block owning x_l1 / w_l1 and those two."""
    dim, c, many = plan.dim, plan.chunk, plan.blocks_per_tile > 1
    pl, ph = b.for_(0, 2, 1, "ph")
    bl, i = pl.for_(0, plan.blocks_per_tile, 1, "blk") if many else (pl, 0)
    blk = bl.addi(first, i) if many else first
    lb, c0 = bl.for_(0, dim, c, "c")
    xl, wl = lb.alloc("x_l1", t.xl_ty), lb.alloc("w_l1", t.wl_ty)
    lb.dma(wl, t.wl_ty, None, t.w2, t.w2_ty, ([c0], [c], [1]))
    lb.dma(xl, t.xl_ty, None, t.x, t.x_ty, ([lb.muli(blk, BLOCK), c0], [BLOCK, c], [dim, 1]))

    def i32(name, v):
        return lb.value(f"{name}_i32", f"arith.index_cast {lb.idx(v)} : index to i32")

    t.call(lb, symbol, xl, wl, eps, [i32("ph", ph), i32("blk", i) if many else lb.i32(0), i32("c0", c0)])
    return lb, lb.addi(lb.muli(blk, GROUP_BYTES * dim), lb.muli(c0, GROUP_BYTES)), lb, xl, wl


def _xwhole(b, plan, symbol: str, first: str, t: _Tile, eps: float):
    """x (8 whole rows) in one copy at the top of the herd; per block its DMA, then per chunk the weight chunk and one
    phase-1 call (the first chunk's sums the rows first). Returns the chunk loop's body, the chunk's offset in y, the
    block owning w_l1, x_l1 and w_l1."""
    dim, c, many = plan.dim, plan.chunk, plan.blocks_per_tile > 1
    xl = b.alloc("x_l1", t.xl_ty)
    b.pin_to_scope(xl, t.xl_ty)   # one copy (the 8 rows fit only so), not moved into the loop
    bl, i = b.for_(0, plan.blocks_per_tile, 1, "blk") if many else (b, 0)
    blk = bl.addi(first, i) if many else first
    bl.dma(xl, t.xl_ty, None, t.x, t.x_ty, ([bl.muli(blk, BLOCK * dim)], [BLOCK * dim], [1]))
    lb, c0 = bl.for_(0, dim, c, "c")
    wl = lb.alloc("w_l1", t.wl_ty)
    lb.dma(wl, t.wl_ty, None, t.w2, t.w2_ty, ([c0], [c], [1]))
    t.call(lb, symbol, xl, wl, eps, [lb.i32(1), lb.i32(0),
                                     lb.value("c0_i32", f"arith.index_cast {lb.idx(c0)} : index to i32")])
    return lb, lb.addi(lb.muli(blk, GROUP_BYTES * dim), lb.muli(c0, GROUP_BYTES)), lb, xl, wl
