"""The GEMM's output C in block float (GemmPlan.c_format "bfp16"; kernel_builder/gemm/builder.py calls these):
c = i8 [m/8, 9n], the at-rest format of the weights (kernel_builder/block_float.py). Each tile's epilogue
(external_kernels/gemm_c_bfp.h) leaves its [tile_m, out_n] tile as 72-byte blocks [tile_m/8][out_n/8] over the
front of its accumulator, i.e. tile_m/8 block rows of 9 out_n bytes: the at-rest bytes of that piece of C.

Data movement (the bf16 C's, in bytes): tile (i, j) -> its herd row's L2 C row panel [tile_m/8, 9 bn_out] bytes
at byte column 9 j out_n (one run of 9 out_n bytes per block row); the panel -> c[row block, byte 9 n0] in
pieces of `plan.c_chunk` columns (one run of 9 q bytes per block row and piece, at most NPU2.shim_bd_max_size i8
on the shim: the tools merge contiguous dims and split a longer run on their own, which costs the dim the launch
loop folds into). The L2 panel is typed bf16 ([tile_m/8, 9 bn_out / 2]: the same bytes), as the accumulator the
tiles send from is (AIR channels carry one element type; a DMA moves bytes, kernel_builder's interpreter and the
tools take different element types on its two sides); its memory-tile BD dims are then at most 9 q / 2 and
9 out_n / 2 bf16 elements (plan._gemm_fits keeps them within NPU2.bd_max_size).
"""
from __future__ import annotations

from kernel_builder.emit import L2, memref
from kernel_builder.gemm import plan as gemm_plan

BLOCK = 8
BFP_ROW = 9    # bytes per column of one 8-row block row


def l2_type(p: gemm_plan.GemmPlan) -> str:
    """One herd row's L2 C row panel: [tile_m/8, 9 bn_out] bytes as bf16."""
    return memref([p.tile_m // BLOCK, BFP_ROW * p.bn_out // 2], "bf16", L2)


def get_pattern(p: gemm_plan.GemmPlan, j: int) -> tuple:
    """Where tile j of a herd row lands in the row panel (bf16 elements): per block row 9 out_n bytes."""
    return ([0, BFP_ROW * j * p.out_n // 2], [p.tile_m // BLOCK, BFP_ROW * p.out_n // 2],
            [BFP_ROW * p.bn_out // 2, 1])


def write_patterns(p: gemm_plan.GemmPlan, n: int, row_block, byte_col) -> tuple:
    """(L3 pattern in bytes, L2 pattern in bf16 elements) of one row panel's write to c[row_block, byte_col]."""
    q = gemm_plan.c_chunk(p)
    rows = p.tile_m // BLOCK
    if q == p.bn_out:
        return ([row_block, byte_col], [rows, BFP_ROW * p.bn_out], [BFP_ROW * n, 1]), None
    pieces = p.bn_out // q
    l3 = ([0, row_block, byte_col], [pieces, rows, BFP_ROW * q], [BFP_ROW * q, BFP_ROW * n, 1])
    l2 = ([0, 0, 0], [pieces, rows, BFP_ROW * q // 2], [BFP_ROW * q // 2, BFP_ROW * p.bn_out // 2, 1])
    return l3, l2


def drain(s, p: gemm_plan.GemmPlan, n: int, c: str, c_ty: str, row0: str, col0: str, ch_c: str) -> None:
    """Streamed A: per herd row its herd_n tiles into one L2 row panel, then the panel to L3 (block row row0 +
    i tile_m/8, byte column col0)."""
    c2_ty = l2_type(p)
    for i in range(p.herd_m):
        c2 = s.alloc("c_l2", c2_ty)
        for j in range(p.herd_n):
            s.channel_get(ch_c, [i, j], c2, c2_ty, get_pattern(p, j))
        l3, l2 = write_patterns(p, n, _plus(s, row0, i * p.tile_m // BLOCK), col0)
        s.dma(c, c_ty, l3, c2, c2_ty, l2)
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
        l3, l2 = write_patterns(p, n, _plus(dl, row0, i * p.tile_m // BLOCK), d0)
        dl.dma(c, c_ty, l3, buf, c2_ty, l2)
    for buf in c2:
        s.dealloc(buf, c2_ty)


def _plus(b, base: str, offset: int) -> str:
    return base if offset == 0 else b.addi(base, offset)
