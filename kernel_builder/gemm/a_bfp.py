"""The GEMM's A operand at rest in block float (GemmPlan.a_format "bfp16", kind gemm_bfp with a="bfp16").

A [m, k] arrives as the weights' at-rest bytes (kernel_builder/block_float.py): i8 [m/8, 9k], 8x8 blocks of 72 bytes,
block-row major, each block row [E, m0 .. m7] = 8 consecutive columns of ONE row of A sharing E: exactly the
bfp16ebs8 A operand of the matrix unit's mac_8x8_8x8T, so the core pops it as stored (no conversion, no scratch).
The data movement follows the rules learnt for W in block float (gemm/plan.py _gemm_fits, gemm/builder.py
_bfp_slice): a panel row at the shim is one run of 9 * tile_k_l2 bytes (<= NPU2.shim_bd_max_size), and the L1 tile
is cut in K chunks of C = bfp_chunk_k(tile_k) columns, one run of 9C bytes (<= NPU2.bd_max_size) per block row:

  L1 A tile    [tile_k/C][tile_m/8][C/8] blocks (the W tile's chunked order, external_kernels/gemm_bfp.cc)
  streamed     L2 panel i8 [tile_m/8, 9 * tile_k_l2] (block rows, a plain copy of the L3 rows); slice = W's pattern
  resident     L2 panel i8 [tile_m * 9k / 8] stored chunk-major [k/C][tile_m/8][9C] (the memory tile's S2MM writes
               the block rows so: three dims, k/C <= NPU2.bd_max_size), so each tile_k slice is ONE contiguous run
               and the slice loop and the column-block loop fold into one memory-tile BD (a linear transfer)
"""
from __future__ import annotations

from kernel_builder.block_float import BLOCK, GROUP_BYTES
from kernel_builder.emit import L1, L2, memref
from kernel_builder.gemm.external import A_FORMATS, bfp_chunk_k
from kernel_builder.hw.facts import NPU2


def check_format(a_format: str, w_format: str) -> None:
    """One clear error for an A format the GEMM does not take (block-float A needs the block-float W object)."""
    if a_format not in A_FORMATS:
        raise ValueError(f"gemm: unknown A format {a_format!r} (known: {', '.join(A_FORMATS)})")
    if a_format == "bfp16" and w_format != "bfp16":
        raise ValueError("gemm: A in block float needs W in block float (kind gemm_bfp)")


def fits(p, k: int) -> bool:
    """The DMA rules of a block-float A panel: a block row's tile_k_l2 panel row is one shim run (streamed), the
    resident panel's chunk-major write has k/C chunks in one memory-tile BD dim."""
    if p.a_resident:
        return k // bfp_chunk_k(p.tile_k) <= NPU2.bd_max_size
    return GROUP_BYTES * p.tile_k_l2 <= NPU2.shim_bd_max_size


def l3_type(m: int, k: int) -> str:
    return memref([m // BLOCK, GROUP_BYTES * k], "i8")


def l1_type(p) -> str:
    return memref([p.a_bytes(p.tile_m, p.tile_k)], "i8", L1)


def panel_type(p, k2: int) -> str:
    """The streamed L2 A panel of k2 columns: block rows [tile_m/8, 9 * k2]."""
    return memref([p.tile_m // BLOCK, GROUP_BYTES * k2], "i8", L2)


def load(kl, p, k: int, k2: int, a: str, a_ty: str, buf: str, row, kp_bytes) -> None:
    """L3 -> L2: block rows [row, +tile_m/8) and bytes [kp_bytes, +9 * k2) of a into the panel (one run each)."""
    kl.dma(buf, panel_type(p, k2), None, a, a_ty,
           ([row, kp_bytes], [p.tile_m // BLOCK, GROUP_BYTES * k2], [GROUP_BYTES * k, 1]))


def slice_(p, k2: int, byte0) -> tuple:
    """The tile_k slice starting at byte `byte0` of each block row of a streamed panel, in the L1 order: per K
    chunk of C columns one run of 9C bytes per block row (gemm/builder.py _bfp_slice with tile_m rows)."""
    c = bfp_chunk_k(p.tile_k)
    rows = ([0, byte0], [p.tile_m // BLOCK, GROUP_BYTES * c], [GROUP_BYTES * k2, 1])
    if c == p.tile_k:
        return rows
    return ([0] + rows[0], [p.tile_k // c] + rows[1], [GROUP_BYTES * c] + rows[2])


def resident_type(p, k: int) -> str:
    return memref([p.a_bytes(p.tile_m, k)], "i8", L2)


def resident_load(s, p, k: int, a: str, a_ty: str, buf: str, row) -> None:
    """L3 -> L2 of herd row's whole A panel: block rows [row, +tile_m/8) of a, written chunk-major."""
    c = bfp_chunk_k(p.tile_k)
    rows = p.tile_m // BLOCK
    dst = ([0, 0, 0], [rows, k // c, GROUP_BYTES * c], [GROUP_BYTES * c, rows * GROUP_BYTES * c, 1])
    s.dma(buf, resident_type(p, k), dst, a, a_ty, ([row, 0], [rows, GROUP_BYTES * k], [GROUP_BYTES * k, 1]))


def resident_puts(b, p, k: int, bufs: list[str], ch_a: str) -> None:
    """In block `b` (the column-block loop): each herd row's tile_k slices, one contiguous run each."""
    tile = p.a_bytes(p.tile_m, p.tile_k)
    sl, byte0 = b.for_(0, p.a_bytes(p.tile_m, k), tile, "ka")
    for i, buf in enumerate(bufs):
        sl.channel_put(ch_a, [i, 0], buf, resident_type(p, k), ([byte0], [tile], [1]))
