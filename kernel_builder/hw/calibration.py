"""Calibration points for the cost model: published per-module NPU2 (Strix) times of a reference design,
with the work and data movement of each of its launches modelled from the design's description.

Source of the figures and of the designs: /work/shared/reference/llama32_1b_npu2_implementation_guide.txt
(the mlir-air llama32_1b example; its B2 tile-mapping table gives the herds: GEMM [8, 4], RMSNorm, RoPE,
SwiGLU, add and GEMV [8, 1], decode RoPE [1, 1], FlashAttention a cascade of about 32 tiles) and the
per-module times published for it (per layer at 2048 rows: o_ffn 41.0 ms, flash_attn 21.6 ms,
rms_gemms_rope 7.3 ms; per decode token: o_gemv_ffn 3.6 ms, rms_gemv_rope 0.9 ms, LM head about 14 ms).
The points are plain kernel shapes (m, k, n, rows, dim, heads ...): the kernel layer knows no model.

How each launch is modelled (docs/hardware-model.md, "Calibration"):
- GEMM: the upstream L2-staged broadcast design; tiles from kernel_builder.planner.plan_gemm (the reference's
  own tile configs are not published), MACs vectorised at the bf16 mmul rate; A streamed over herd_m shim
  channels n/BN times, B over herd_n channels m/BM times, C drained through L2 over herd_m channels.
- GEMV: W rows split over 8 tiles and 8 shim channels, x broadcast once, 32-lane MACs.
- RMSNorm / add / SwiGLU / RoPE: vectorised elementwise work (ops per element / 16 lanes) over 8 tiles (1 for
  decode RoPE), one shim channel per tile and stream.
- FlashAttention: causal QK^T and PV as mmul work over 32 tiles plus the online-softmax bookkeeping per score
  (query, key), Q and O streamed once, K and V once per block of 4 query tiles. It is the only point whose
  time the softmax sets, so it is what calibrates `softmax_cycles_per_score`.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from kernel_builder import planner
from kernel_builder.hw.analyze import Flow
from kernel_builder.hw.cost import Point

VECTOR_LANES = 16  # f32-accumulating bf16 vector ops (aie::mul/mac on 16 lanes), as in the external kernels


@dataclass
class RefWork:
    tile_vector_cycles: float = 0.0
    tile_matmul_macs: int = 0
    tile_scalar_ops: int = 0
    tile_scores: int = 0
    flows: list = field(default_factory=list)


def _flows(direction: str, n: int, total_bytes: float, tasks: int = 1, what: str = "") -> list[Flow]:
    return [Flow(direction, 0, what, int(total_bytes / n), tasks, 1) for _ in range(n)]


def gemm(m: int, k: int, n: int) -> RefWork:
    p = planner.plan_gemm(m, k, n)
    bm, bn = p.herd_m * p.tile_m, p.herd_n * p.tile_n
    iters = (m // bm) * (n // bn)
    flows = (_flows("MM2S", p.herd_m, 2 * m * k * (n // bn), iters, "A panels")
             + _flows("MM2S", p.herd_n, 2 * k * n * (m // bm), iters, "B panels")
             + _flows("S2MM", p.herd_m, 2 * m * n, iters, "C"))
    return RefWork(tile_matmul_macs=p.tile_m * p.tile_n * k * iters, flows=flows)


def gemv(m: int, k: int, herd: int = 8) -> RefWork:
    flows = _flows("MM2S", herd, 2 * m * k, 1, "W") + _flows("MM2S", 1, 2 * k, 1, "x") + \
        _flows("S2MM", herd, 2 * m, 1, "y")
    return RefWork(tile_vector_cycles=(m / herd) * k / 32, flows=flows)


def eltwise(rows: int, dim: int, n_in: int, ops_per_element: float, herd: int = 8) -> RefWork:
    herd = min(herd, rows * dim // 256 or 1)
    flows = sum((_flows("MM2S", herd, 2 * rows * dim, 1) for _ in range(n_in)), []) + \
        _flows("S2MM", herd, 2 * rows * dim, 1)
    return RefWork(tile_vector_cycles=rows * dim / herd * ops_per_element / VECTOR_LANES, flows=flows)


def rmsnorm(rows: int, dim: int) -> RefWork:
    w = eltwise(rows, dim, 1, 3.0, herd=min(8, rows))
    w.flows += _flows("MM2S", 1, 2 * dim)  # the weight, broadcast
    return w


def rope(rows: int, heads: int, head_dim: int, herd: int = 8) -> RefWork:
    w = eltwise(rows, heads * head_dim, 2, 2.0, herd=min(herd, rows))
    return w


def flash_attn(seq: int, heads: int, kv_heads: int, head_dim: int, tiles: int = 32, q_tile: int = 64,
               q_tiles_per_block: int = 4) -> RefWork:
    pairs = heads * seq * (seq + q_tile) // 2           # causal (query, key) pairs
    kv_reads = seq // (q_tile * q_tiles_per_block) * heads
    flows = (_flows("MM2S", 4, 2 * seq * heads * head_dim, 1, "Q")
             + _flows("MM2S", 4, 2 * 2 * seq * head_dim * kv_reads, 1, "K, V")
             + _flows("S2MM", 4, 2 * seq * heads * head_dim, 1, "O"))
    # QK^T and PV on the mmul unit; the online softmax bookkeeping per score
    return RefWork(tile_matmul_macs=2 * pairs * head_dim // tiles, tile_scores=pairs // tiles, flows=flows)


def reference_points() -> list[Point]:
    """The published modules of the reference design (shapes of its 1B model, 2048-row prefill)."""
    h, q, kv, ffn, hd, seq = 2048, 2048, 512, 8192, 64, 2048
    src = "llama32_1b_npu2_implementation_guide.txt + published per-module Strix times"
    return [
        Point("rms_gemms_rope (2048 rows)", (rmsnorm(seq, h), gemm(seq, h, q), gemm(seq, h, kv), gemm(seq, h, kv),
                                             rope(seq, q // hd, hd), rope(seq, kv // hd, hd)), 7.3e-3, True, src),
        Point("flash_attn (2048 rows)", (flash_attn(seq, q // hd, kv // hd, hd),), 21.6e-3, True, src),
        Point("o_ffn (2048 rows)", (gemm(seq, q, h), eltwise(seq, h, 2, 1.0), rmsnorm(seq, h), gemm(seq, h, ffn),
                                    gemm(seq, h, ffn), eltwise(seq, ffn, 2, 4.0), gemm(seq, ffn, h),
                                    eltwise(seq, h, 2, 1.0)), 41.0e-3, True, src),
        Point("rms_gemv_rope (decode)", (rmsnorm(1, h), gemv(q, h), gemv(kv, h), gemv(kv, h),
                                         rope(1, q // hd, hd, herd=1), rope(1, kv // hd, hd, herd=1)), 0.9e-3, True, src),
        Point("o_gemv_ffn (decode)", (gemv(h, q), eltwise(1, h, 2, 1.0), rmsnorm(1, h), gemv(ffn, h), gemv(ffn, h),
                                      eltwise(1, ffn, 2, 4.0), gemv(h, ffn), eltwise(1, h, 2, 1.0)), 3.6e-3, True, src),
        Point("lm_head (decode)", tuple(gemv(16384, h) for _ in range(8)), 14.0e-3, True, src),
    ]


if __name__ == "__main__":  # pragma: no cover - prints the fitted parameters to paste into cost.PARAMS
    from kernel_builder.hw import cost

    pts = reference_points()
    fitted = cost.calibrate(pts, cost.CostParams())
    for name in cost.FITTED:
        print(f"{name} = {getattr(fitted, name):.4g}")
    for name, m, s, e in cost.errors(pts, fitted):
        print(f"{name:28s} modeled {m * 1e3:8.2f} ms  published {s * 1e3:7.2f} ms  error {e * 100:+6.1f}%")
