"""The GEMM's output C in block float (GemmPlan.c_format "bfp16"; kernel_builder/gemm/builder.py calls these):
c = i8 [m/8, 9n], the at-rest format of the weights (kernel_builder/block_float.py). Each tile's epilogue
(external_kernels/gemm_c_bfp.h) leaves its [tile_m, out_n] tile as 72-byte blocks [tile_m/8][out_n/8] over the
front of its accumulator, i.e. tile_m/8 block rows of 9 out_n bytes: the at-rest bytes of that piece of C.

Data movement, all in bytes (i8 memrefs: the accumulator of such a module is typed i8 too - a DMA between memrefs
of different element types had its sizes rewritten by the real lowering): tile (i, j) -> its herd row's L2 C row
panel [tile_m/8, 9 bn_out] at byte column 9 j out_n; the panel -> c[row block, 9 n0]. A tile's block-row run longer
than a core / memory-tile BD dim (9 out_n > NPU2.bd_max_size) moves in pieces of `c_chunk` columns, the pieces an
outer dim on both sides (the tools merge contiguous dims: only a reordering splits a run); a panel's block-row run
over NPU2.shim_bd_max_size is split by the tool itself on the shim (pieces of our own there cost the dim the launch
or column-block loop folds into: the real lowering then unrolled it and ran out of shim channels).
"""
from __future__ import annotations

from kernel_builder.emit import L1, L2, memref
from kernel_builder.gemm import plan as gemm_plan
from kernel_builder.hw.facts import NPU2

BLOCK = 8
BFP_ROW = 9    # bytes per column of one 8-row block row


def c_chunk(p: gemm_plan.GemmPlan) -> int:
    """Output columns per piece of a tile's send: all out_n when its block-row run (9 bytes per column) fits one
    core / memory-tile BD dim (NPU2.bd_max_size i8), else the largest multiple of 8 dividing out_n that does."""
    return max(q for q in range(8, p.out_n + 1, 8) if p.out_n % q == 0 and BFP_ROW * q <= NPU2.bd_max_size)


def acc_type(p: gemm_plan.GemmPlan) -> str:
    """The L1 accumulator's bytes (tile_m * tile_n f32) as i8."""
    return memref([4 * p.tile_m * p.tile_n], "i8", L1)


def l2_type(p: gemm_plan.GemmPlan) -> str:
    """One herd row's L2 C row panel: [tile_m/8, 9 bn_out] bytes."""
    return memref([p.tile_m // BLOCK, BFP_ROW * p.bn_out], "i8", L2)


def put_pattern(p: gemm_plan.GemmPlan) -> tuple:
    """The tile's send from the front of its accumulator: its block rows, piece by piece (c_chunk columns)."""
    q, rows = c_chunk(p), p.tile_m // BLOCK
    if q == p.out_n:
        return [0], [rows * BFP_ROW * p.out_n], [1]
    return [0, 0, 0], [p.out_n // q, rows, BFP_ROW * q], [BFP_ROW * q, BFP_ROW * p.out_n, 1]


def get_pattern(p: gemm_plan.GemmPlan, j: int) -> tuple:
    """Where tile j of a herd row lands in the row panel, in put_pattern's order."""
    q, rows = c_chunk(p), p.tile_m // BLOCK
    if q == p.out_n:   # as blocks (three dims, the inner two contiguous): a two-dim rectangle on the 2-D panel lets
        # air-split-l2-memref split the pinned panel, which crashed the real lowering (aie-air-opt, SIGSEGV)
        return ([0, j * p.out_n // BLOCK, 0], [rows, p.out_n // BLOCK, BLOCK * BFP_ROW],
                [BFP_ROW * p.bn_out, BLOCK * BFP_ROW, 1])
    return ([0, 0, j * p.out_n // BLOCK, 0], [p.out_n // q, rows, q // BLOCK, BLOCK * BFP_ROW],
            [BFP_ROW * q, BFP_ROW * p.bn_out, BLOCK * BFP_ROW, 1])


def drain(s, p: gemm_plan.GemmPlan, n: int, c: str, c_ty: str, row0: str, col0: str, ch_c: str) -> None:
    """Streamed A: per herd row its herd_n tiles into one L2 row panel, then the panel to L3 (block row row0 +
    i tile_m/8, byte column col0; spread: herd column j's piece 9 n / herd_n bytes further per column)."""
    c2_ty = l2_type(p)
    for i in range(p.herd_m):
        c2 = s.alloc("c_l2", c2_ty)
        for j in range(p.herd_n):
            s.channel_get(ch_c, [i, j], c2, c2_ty, get_pattern(p, j))
        # the whole panel (one linear memory-tile BD) -> its block rows in c (a run of 9 bn_out bytes each, which
        # the shim splits itself when over NPU2.shim_bd_max_size; pieces of our own cost the launch loop's fold)
        row = _plus(s, row0, i * p.tile_m // BLOCK)
        dst = (([row, 0, col0], [p.tile_m // BLOCK, p.herd_n, BFP_ROW * p.out_n], [BFP_ROW * n, BFP_ROW * n // p.herd_n, 1])
               if p.spread else ([row, col0], [p.tile_m // BLOCK, BFP_ROW * p.bn_out], [BFP_ROW * n, 1]))
        s.dma(c, c_ty, dst, c2, c2_ty, None)
        s.dealloc(c2, c2_ty)


def resident_drain(s, p: gemm_plan.GemmPlan, n: int, c: str, c_ty: str, row0: str, ch_c: str) -> None:
    """A resident: one row panel per herd row, pinned outside the loop over the column blocks (one copy: see
    builder._resident_drain for the memory tile's S2MM channel count), each block's tiles gathered and written."""
    c2_ty = l2_type(p)
    c2 = [s.alloc("c_l2", c2_ty) for _ in range(p.herd_m)]
    for buf in c2:
        s.pin_to_scope(buf, c2_ty)
    dl, d0 = s.for_(0, BFP_ROW * n, BFP_ROW * p.bn_out, "nd")   # the column block's first byte
    for i, buf in enumerate(c2):
        for j in range(p.herd_n):
            dl.channel_get(ch_c, [i, j], buf, c2_ty, get_pattern(p, j))
        # the panel leaves block row by block row (as the bf16 panel does): with one DMA of the whole panel after the
        # gets, the real lowering unrolled the last get of each panel over the column blocks (> 48 memory-tile BDs);
        # a block row is one contiguous run on both sides (the shim splits a run over NPU2.shim_bd_max_size itself,
        # which leaves it the block-row and column-block loops: four dims)
        rl, rb = dl.for_(0, p.tile_m // BLOCK, 1, "rb")
        row = rl.addi(rb, _plus(rl, row0, i * p.tile_m // BLOCK))
        rl.dma(c, c_ty, ([row, d0], [1, BFP_ROW * p.bn_out], [BFP_ROW * n, 1]), buf, c2_ty,
               ([rb, 0], [1, BFP_ROW * p.bn_out], [BFP_ROW * p.bn_out, 1]))
    for buf in c2:
        s.dealloc(buf, c2_ty)


def _plus(b, base: str, offset: int) -> str:
    return base if offset == 0 else b.addi(base, offset)
