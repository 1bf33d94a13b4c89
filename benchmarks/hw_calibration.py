"""Calibration points for the cost model: published per-module NPU2 (Strix) times of a reference design,
with the work and data movement of each of its launches modelled from the design's description.

Source of the figures and of the designs: the Llama-3.2-1B NPU2 implementation guide
(of the mlir-air llama32_1b example; its B2 tile-mapping table gives the herds: GEMM [8, 4], RMSNorm, RoPE,
SwiGLU, add and GEMV [8, 1], decode RoPE [1, 1], FlashAttention a cascade of about 32 tiles) and the
per-module times published for it (per layer at 2048 rows: o_ffn 41.0 ms, flash_attn 21.6 ms,
rms_gemms_rope 7.3 ms; per decode token: o_gemv_ffn 3.6 ms, rms_gemv_rope 0.9 ms, LM head about 14 ms).
The points are plain kernel shapes (m, k, n, rows, dim, heads ...): the kernel layer knows no model.

How each launch is modelled (docs/hardware-model.md, "Calibration"). Compute is counted like ours: each
design's kernel calls are charged the instruction counts of OUR kernel of the same job at the design's tile
(kernel_builder/<kind>/external.py descriptors; the reference's own kernel sources differ in detail - an
assumption the calibration errors measure):
- GEMM: the upstream L2-staged broadcast design; tiles from kernel_builder.gemm.plan.plan_gemm (the reference's
  own tile configs are not published), per tile and output block zero + k/64 block-float mac calls + out
  (gemm.cc's counts; the mac without gemm.cc's block-float A scratch, as mm_aie2p.cc converts per register block); A and B streamed over the 8 columns (n/BN and m/BM times, two MM2S per column), C drained
  through L2 over herd_m channels.
- GEMV: W rows split over 8 tiles and 8 shim channels, x broadcast once; gemv.cc's counts, 4 rows per call.
- RMSNorm / add / SwiGLU / RoPE / the f32 -> bf16 cast: rmsnorm.cc / add.cc / swiglu.cc / rope.cc / gemm.cc out
  counts per tile over 8 tiles (1 for decode RoPE), one shim channel per tile and stream.
- FlashAttention: the causal score matrix over 32 tiles as attention.cc prefill items (64 x 64, every key
  visible) compiled with aie_api's block-float flag (as mlir-air compiles its attention), Q and O streamed
  once, K and V once per block of 4 query tiles.
- the stream into each tile's L1 (`tile_l1_in_bytes`: a GEMM tile's A or W panel, a GEMV tile's weight rows,
  an elementwise tile's rows) for the L2 -> L1 rate.
The reference's modules are multi-launch ELFs (the cost model's ELF factor applies to their GEMM launches);
the registry's points are standalone xclbin runs (`elf=False`).
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

from kernel_builder.external_costs import external_cost
from kernel_builder.gemm import plan as gemm_plan
from kernel_builder.gemm.external import gemm_mac_counts
from kernel_builder.hw.results import Flow
from kernel_builder.hw.cost import Point
from kernel_builder.instr_counts import Counts


@dataclass
class RefWork:
    tile_counts: dict = field(default_factory=dict)   # the busiest tile's instruction counts (+ "calls")
    tile_matmul_macs: int = 0
    tile_scalar_ops: int = 0
    tile_l1_in_bytes: int = 0     # the busiest tile's busiest stream into L1
    flows: list = field(default_factory=list)


def calls(symbol: str, n: float, operands: tuple = ()) -> tuple[Counts, float]:
    """n calls of one of our kernels (its descriptor's counts, + n "calls") and their scalar ops."""
    ec, m = external_cost(symbol)
    w = ec.work(m, list(operands))
    return Counts(**w.counts) * n + Counts(calls=n), w.scalar_ops * n


def _work(parts, **kw) -> RefWork:
    counts, scalar = Counts(), 0.0
    for c, s in parts:
        counts, scalar = counts + c, scalar + s
    return RefWork(tile_counts=dict(counts), tile_scalar_ops=scalar, **kw)


COLUMNS = 8


def _flows(direction: str, n: int, total_bytes: float, tasks: int = 1, what: str = "") -> list[Flow]:
    """n shim channels sharing total_bytes, channel i on column i mod 8 (so two such groups of one launch put
    two channels on a column, as the shim allocator's two channels per column and direction)."""
    return [Flow(direction, 0, what, int(total_bytes / n), tasks, 1, column=i % COLUMNS) for i in range(n)]


def gemm(m: int, k: int, n: int, tile_m: int | None = None, tile_n: int | None = None, herd_m: int = 8,
         herd_n: int = 4, out_bytes: int = 2) -> RefWork:
    """The upstream L2-staged GEMM: per launch point a [BM, BN] block (BM = herd_m*tile_m, BN = herd_n*tile_n);
    A streamed n/BN times and B m/BM times, each spread over the 8 columns (two MM2S channels per column: the
    reference's shim layout is not published), C drained through L2 over herd_m channels; MACs on the mmul
    unit. Without tile sizes: kernel_builder.gemm.plan's plan."""
    if tile_m is None:
        p = gemm_plan.plan_gemm(m, k, n, resident=False)   # the upstream design streams A per column block
        tile_m, tile_n, herd_m, herd_n = p.tile_m, p.tile_n, p.herd_m, p.herd_n
    bm, bn = herd_m * tile_m, herd_n * tile_n
    iters = (m // bm) * (n // bn)
    flows = (_flows("MM2S", COLUMNS, 2 * m * k * (n // bn), iters, "A panels")
             + _flows("MM2S", COLUMNS, 2 * k * n * (m // bm), iters, "B panels")
             + _flows("S2MM", herd_m, out_bytes * m * n, iters, "C"))
    tag = f"m{tile_m}_k64_n{tile_n}"
    # the reference's micro-kernel (mm_aie2p.cc, 2x2 register blocks) converts its operand blocks per register
    # block: gemm.cc's loop counts without the block-float A scratch (gemm_mac_counts(a_scratch=False))
    mac = gemm_mac_counts(tile_m, 64, tile_n, a_scratch=False)
    macs = (Counts(**mac) * (iters * k // 64) + Counts(calls=iters * k // 64), 0.0)
    return _work([calls(f"gemm_zero_bf16_{tag}", iters), macs, calls(f"gemm_out_bf16_{tag}", iters)],
                 flows=flows, tile_l1_in_bytes=2 * k * max(tile_m, tile_n) * iters)


def cast(elements: int) -> RefWork:
    """The fused-cast design's second launch: f32 scratch -> bf16 over an [8, 1] herd (gemm.cc's out, 4096
    elements per call)."""
    w = eltwise(1, elements, 0, "cast")
    w.flows += _flows("MM2S", 8, 4 * elements)
    return w


def gemv(m: int, k: int, herd: int = 8) -> RefWork:
    flows = _flows("MM2S", herd, 2 * m * k, 1, "W") + _flows("MM2S", 1, 2 * k, 1, "x") + \
        _flows("S2MM", herd, 2 * m, 1, "y")
    rows = m // herd
    return _work([calls(f"mv_bf16_k{k}_c{k}_m4_r{rows}", rows / 4, (None,) * 5 + (0,))], flows=flows,
                 tile_l1_in_bytes=int(2 * m * k / herd))


CHUNK = 4096   # elements per elementwise kernel call (one L1 chunk)


def _eltwise_calls(kind: str, elements: int, rows: int, dim: int) -> tuple[Counts, float]:
    """One tile's calls of our kernel for `kind` over `elements` elements (rows of `dim` for rmsnorm)."""
    if kind == "add":
        return calls(f"add_bf16_n{CHUNK}", elements / CHUNK)
    if kind == "swiglu":
        return calls(f"swiglu_bf16_n{CHUNK}", elements / CHUNK)
    if kind == "cast":
        return calls("gemm_out_bf16_m64_k64_n64", elements / CHUNK)
    if kind == "rmsnorm":
        return calls(f"rmsnorm_bf16_g{dim}_u1", elements / dim)
    raise ValueError(kind)


def eltwise(rows: int, dim: int, n_in: int, kind: str, herd: int = 8) -> RefWork:
    herd = min(herd, rows * dim // 256 or 1)
    flows = sum((_flows("MM2S", herd, 2 * rows * dim, 1) for _ in range(n_in)), []) + \
        _flows("S2MM", herd, 2 * rows * dim, 1)
    return _work([_eltwise_calls(kind, rows * dim / herd, rows, dim)], flows=flows,
                 tile_l1_in_bytes=int(2 * rows * dim / herd) if n_in else 0)


def rmsnorm(rows: int, dim: int) -> RefWork:
    w = eltwise(rows, dim, 1, "rmsnorm", herd=min(8, rows))
    w.flows += _flows("MM2S", 1, 2 * dim)  # the weight, broadcast
    return w


def rope(rows: int, heads: int, head_dim: int, herd: int = 8) -> RefWork:
    herd = min(herd, rows, rows * heads * head_dim // 256 or 1)
    flows = _flows("MM2S", herd, 2 * rows * heads * head_dim, 1) * 2 + \
        _flows("S2MM", herd, 2 * rows * heads * head_dim, 1)
    return _work([calls(f"rope_bf16_hd{head_dim}_h{heads}_r1", rows / herd)], flows=flows,
                 tile_l1_in_bytes=int(2 * rows * heads * head_dim / herd))


def flash_attn(seq: int, heads: int, kv_heads: int, head_dim: int, tiles: int = 32, lqp: int = 256) -> RefWork:
    """The seq-first cascade design: launch [seq/lqp, heads/2], 2 heads x 4 query tiles x 4
    cascade stages = 32 tiles; every K chunk is streamed and computed (the causal mask is applied per block),
    so the work is the full seq x seq score matrix; Q/K and V through 16 shim MM2S streams, K/V re-read once
    per launch row, O out through 2 S2MM."""
    scores = heads * seq * seq
    kv_bytes = 2 * 2 * seq * head_dim * heads * (seq // lqp)
    flows = (_flows("MM2S", 16, 2 * seq * heads * head_dim + kv_bytes, (seq // lqp) * heads // 2, "Q, K, V")
             + _flows("S2MM", 2, 2 * seq * heads * head_dim, (seq // lqp) * heads // 2, "O"))
    items = scores / tiles / (64 * 64)       # 64 x 64 items, every key visible, block-float (mlir-air's flag)
    return _work([(_reference_attention_item(head_dim, 64, 64) * items + Counts(calls=items), 0)], flows=flows)


def _reference_attention_item(hd: int, lq: int, lk: int) -> Counts:
    """One fully visible lq x lk item of the reference's flash attention (mlir-air attn_npu2.cc: aie_api's bf16 mmul
    under the block-float flag, which converts both operands and transposes B on every mac; K transposed in
    software, f32 score scaling), counted as attention.cc's former prefill path compiled with that flag: per
    4-row block, Q.K^T and P.V in 4x8x8 steps (each one block-float MAC, 2 conversions, 1 shuffle) on operands
    gathered with 128-bit loads, and the row softmax with its f32 scaling."""
    from kernel_builder.attention import counts as ac
    from kernel_builder.instr_counts import conv, fmul, load, store

    mm = Counts(mmul_bfp16_8x8x8=1, bfp16_convert=2, shuffle=1, vconvert=2)
    qk = (lk // 8) * ((hd // 8) * (load(8, 2) * 12 + Counts(shuffle=1) + mm) + conv() + store(8, 4) * 4)
    pv = (hd // 8) * ((load(8, 4) + fmul(8) + conv()) * 4 + (lk // 8) * (load(8, 2) * 12 + mm) + conv()
                      + store(8, 4) * 4)
    return (qk + pv + ac.softmax_rows([lk] * 4, lk)) * (lq // 4)   # softmax_rows scales the scores in f32


def reference_points() -> list[Point]:
    """The published modules of the reference design (shapes of its 1B model, 2048-row prefill; GEMM tile
    configs from the kernel registry, as its builders use them)."""
    h, q, kv, ffn, hd, seq = 2048, 2048, 512, 8192, 64, 2048
    src = "reference design, published per-module Strix times (guide; llama32_1b docs/profile.md)"
    qo = lambda kk, nn: (gemm(seq, kk, nn, 64, 128, out_bytes=4), cast(seq * nn))  # noqa: E731 - fused-cast
    kvg = gemm(seq, h, kv, 32, 128)                                                  # drain
    return [
        Point("rms_gemms_rope (2048 rows)", (rmsnorm(seq, h), *qo(h, q), kvg, kvg, rope(seq, q // hd, hd),
                                             rope(seq, kv // hd, hd)), 7.3e-3, True, src),
        Point("flash_attn (2048 rows)", (flash_attn(seq, q // hd, kv // hd, hd),), 21.6e-3, True, src),
        Point("o_ffn (2048 rows)", (*qo(q, h), eltwise(seq, h, 2, "add"), rmsnorm(seq, h), *qo(h, ffn),
                                    *qo(h, ffn), eltwise(seq, ffn, 2, "swiglu"), *qo(ffn, h),
                                    eltwise(seq, h, 2, "add")), 41.0e-3, True, src),
        Point("rms_gemv_rope (decode)", (rmsnorm(1, h), gemv(q, h), gemv(kv, h), gemv(kv, h),
                                         rope(1, q // hd, hd, herd=1), rope(1, kv // hd, hd, herd=1)), 0.9e-3, True,
              src),
        Point("o_gemv_ffn (decode)", (gemv(h, q), eltwise(1, h, 2, "add"), rmsnorm(1, h), gemv(ffn, h),
                                      gemv(ffn, h), eltwise(1, ffn, 2, "swiglu"), gemv(h, ffn),
                                      eltwise(1, h, 2, "add")), 3.6e-3, True, src),
        Point("lm_head (decode)", tuple(gemv(16384, h) for _ in range(8)), 14.0e-3, True, src),
    ]


def _gflops(macs: float, gflop_per_s: float) -> float:
    return 2 * macs / (gflop_per_s * 1e9)


def registry_points() -> list[Point]:
    """Single-kernel NPU2 measurements of mlir-air's programming_examples/kernel_registry (supported_kernels.md
    and details/*.md, June-August 2026, standalone xclbin harness: `elf=False`)."""
    return [replace(p, elf=False) for p in _registry_points()]


def _registry_points() -> list[Point]:
    src = "mlir-air kernel_registry"
    m = 2048
    return [
        Point("registry GEMM 2048x2048x2048 (f32 out)", (gemm(m, m, m, 64, 128, out_bytes=4),),
              _gflops(m * m * m, 8508), True, src + " details/GEMM_bf16_in_fp32_out.md"),
        Point("registry GEMM 2048x2048x8192 (f32 out)", (gemm(m, m, 8192, 64, 128, out_bytes=4),),
              _gflops(m * m * 8192, 8278), True, src + " details/GEMM_bf16_in_fp32_out.md"),
        Point("registry GEMM 2048x8192x2048 (f32 out)", (gemm(m, 8192, m, 64, 128, out_bytes=4),),
              _gflops(m * 8192 * m, 9797), True, src + " details/GEMM_bf16_in_fp32_out.md"),
        Point("registry GEMM 2048x2048x512 (f32 out)", (gemm(m, m, 512, 64, 128, out_bytes=4),),
              _gflops(m * m * 512, 7342), True, src + " details/GEMM_bf16_in_fp32_out.md"),
        Point("registry GEMV 2048x2048", (gemv(2048, 2048),), 330e-6, True, src + " details/GEMV_bf16.md"),
        Point("registry GEMV 512x2048", (gemv(512, 2048),), 136e-6, True, src + " details/GEMV_bf16.md"),
        Point("registry GEMV 8192x2048", (gemv(8192, 2048),), 1067e-6, True, src + " details/GEMV_bf16.md"),
        Point("registry GEMV 2048x8192", (gemv(2048, 8192),), 1082e-6, True, src + " details/GEMV_bf16.md"),
        Point("registry GEMV 16384x2048", (gemv(16384, 2048),), 2193e-6, True, src + " details/GEMV_bf16.md"),
        Point("registry FlashAttention 2048, 32q/8kv, hd 64", (flash_attn(2048, 32, 8, 64),), 15.75e-3, True,
              src + " details/FlashAttention_bf16.md"),
        Point("registry add 2048x2048", (eltwise(2048, 2048, 2, "add"),), 437e-6, True,
              src + " details/EltwiseAdd_bf16.md"),
        Point("registry SiLU-and-mul 2048x8192", (eltwise(2048, 8192, 2, "swiglu"),), 4016e-6, True,
              src + " details/SiLU_Mul_bf16.md"),
        Point("registry RMSNorm 2048x2048", (rmsnorm(2048, 2048),), 911e-6, True, src + " details/RMSNorm_bf16.md"),
        Point("registry RoPE 65536x64", (rope(65536, 1, 64),), 579e-6, True, src + " details/RoPE_bf16.md"),
        Point("registry RoPE 32x64 (decode)", (rope(32, 1, 64),), 82e-6, True, src + " details/RoPE_bf16.md"),
    ]


def all_points() -> list[Point]:
    return reference_points() + registry_points()


if __name__ == "__main__":  # pragma: no cover - prints the fitted values to paste into cost.CostParams
    from kernel_builder.hw import cost

    for label, pts in (("all points (likely)", all_points()), ("registry alone", registry_points()),
                       ("reference modules alone", reference_points())):
        fitted = cost.calibrate(pts, cost.PARAMS)
        print(f"{label}: " + ", ".join(f"{n} = {getattr(fitted, n):.4g}" for n in cost.FITTED))
    for name, m, s, e in cost.errors(all_points()):
        print(f"{name:44s} modeled {m * 1e3:8.2f} ms  published {s * 1e3:7.2f} ms  error {e * 100:+6.1f}%")
