"""GEMV on weights at rest in block float: y[0, i] = sum_k w[i, k] * x[0, k] with w given as its bfp16ebs8 bytes
i8 [m/8, 9k] (kernel_builder.block_float: 8x8 blocks of 72 bytes, block-row major), consumed by AIE2P's
block-float matrix unit (external_kernels/gemv_bfp.cc; numerics in kernel_builder.gemv_bfp.reference).

The data movement is the gemv kernel's (kernel_builder.gemv.builder.emit): launch [1, 1] -> segment -> herd
[herd_x, herd_y], each tile one stream straight from L3 on its own channel `@gemvbfp_in[tx, ty]`: x [k] (then,
with `bias`, the tile's bias rows, in x's one transfer) kept in L1, then its block rows [r0/8, (r0 + R)/8) of w,
one contiguous run of R/8 * 9k bytes, received one or two block rows (or one block row's K chunk) per step into a
ping-ponged `w_l1`; f32 partial sums carried in `acc_l1` across K chunks; the tile's R outputs stay in `y_l1` and
are stored to L3 with one DMA. What crosses the shim is the at-rest bytes: 9/16 of the bf16 GEMV's weight stream.
"""
from __future__ import annotations

from kernel_builder import block_float
from kernel_builder.emit import L1, memref
from kernel_builder.gemv.builder import emit
from kernel_builder.gemv_bfp.external import BFP_BLOCK, gemv_bfp_kernel
from kernel_builder.gemv_bfp.plan import plan_gemv_bfp

KIND = "gemv_bfp"
CHANNEL = "gemvbfp_in"


def build(m: int, k: int, bias: bool = False) -> str:
    """bias: the `gemv_bfp_bias` kernel (arguments w, x, b [1, m], y: y = W x + b)."""
    plan = plan_gemv_bfp(m, k, bias)
    ext = gemv_bfp_kernel(k, plan.k_chunk, plan.tile_m, plan.rows_per_tile, bias)
    row = block_float.row_bytes(k)
    step_bytes = plan.tile_m * plan.k_chunk * block_float.GROUP_BYTES // BFP_BLOCK
    return emit(plan, ext, "gemv_bfp_bias" if bias else KIND, (CHANNEL, "gemvbfp_seg", "gemvbfp_herd"),
                (memref([m // BFP_BLOCK, row], "i8"), row, BFP_BLOCK), memref([step_bytes], "i8", L1))
