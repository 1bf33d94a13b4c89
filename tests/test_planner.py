"""Tiling plans: every plan fits the NPU2 limits and divides its shape; untileable shapes fail clearly."""
from __future__ import annotations

import pytest

from kernel_builder import planner as P
from llama_npu.models.llama import LLAMA32_1B, LLAMA32_3B, SMOLLM2_135M

MODELS = [LLAMA32_1B, LLAMA32_3B, SMOLLM2_135M]
SEQS = [16, 32, 64, 128, 256, 512, 1024, 2048]


def _projections(s):
    return [(s.hidden, s.q_dim), (s.hidden, s.kv_dim), (s.q_dim, s.hidden), (s.hidden, s.ffn),
            (s.ffn, s.hidden)]


@pytest.mark.parametrize("s", MODELS, ids=["1b", "3b", "smollm2"])
@pytest.mark.parametrize("seq", SEQS)
def test_gemm_plans_fit_and_divide(s, seq):
    for k, n in _projections(s):
        p = P.plan_gemm(seq, k, n)
        assert seq % (p.tile_m * p.herd_m) == 0 and n % (p.tile_n * p.herd_n) == 0
        assert k % p.tile_k == 0
        assert p.tile_m % P.MMUL_M == 0 and p.tile_n % P.MMUL_N == 0 and p.tile_k % P.MMUL_K == 0
        assert 1 <= p.herd_m <= P.NPU2_COLS and 1 <= p.herd_n <= P.NPU2_ROWS
        assert p.l1_bytes() <= P.L1_BUDGET
        # double-buffered bf16 A/B panels in one memory tile; the accumulator stays in L1
        l2 = p.l2_buffers()
        assert set(l2) == {"a_panels", "b_panels"}
        assert l2["a_panels"] == 2 * P.BF16 * p.herd_m * p.tile_m * p.tile_k
        assert l2["b_panels"] == 2 * P.BF16 * p.tile_k * p.herd_n * p.tile_n
        assert p.l2_bytes() <= P.MEMTILE_BYTES


def test_gemm_l1_accounting_covers_every_herd_buffer():
    p = P.GemmPlan(tile_m=64, tile_k=64, tile_n=64, herd_m=8, herd_n=4)
    # f32 acc 16 KiB + 2x A 8 KiB + 2x B 8 KiB + bf16 out 8 KiB
    assert p.l1_buffers() == {"acc_f32": 16384, "a_tiles": 16384, "b_tiles": 16384, "out_bf16": 8192}
    assert p.l1_bytes() == 56 * 1024 <= P.L1_BUDGET
    assert P.GemmPlan(128, 64, 64, 1, 1).l1_bytes() > P.L1_BUDGET  # 32+32+16+16 KiB


def test_gemm_l2_accounting_and_ddr_reads():
    p = P.GemmPlan(tile_m=64, tile_k=64, tile_n=64, herd_m=8, herd_n=4)
    # A panel 512x64 bf16 = 64 KiB, B panel 64x256 bf16 = 32 KiB, each double-buffered
    assert p.l2_buffers() == {"a_panels": 128 * 1024, "b_panels": 64 * 1024}
    # 2048x2048x8192: A (8 MiB) read 8192/256 = 32 times, B (32 MiB) 2048/512 = 4 times
    assert p.ddr_read_bytes(2048, 2048, 8192) == 32 * 8 * 2**20 + 4 * 32 * 2**20
    # the largest tiles the planner considers still fit one memory tile
    assert P.GemmPlan(P.MAX_GEMM_TILE, 64, P.MAX_GEMM_TILE, P.NPU2_COLS, P.NPU2_ROWS).l2_bytes() <= P.MEMTILE_BYTES


def test_gemm_prefers_square_tiles_for_ddr_reuse():
    # tiles stream from L3 every K step: at equal occupancy the planner picks the tile with the fewest
    # DDR bytes per MAC, i.e. 64x64 rather than 128x24-like slivers
    p = P.plan_gemm(2048, 576, 576)
    assert (p.tile_m, p.tile_n) == (64, 48)
    big = P.plan_gemm(2048, 2048, 8192)
    assert (big.tile_m, big.tile_n) == (64, 64)


def test_gemm_uses_full_array_for_llama_prefill():
    p = P.plan_gemm(2048, 2048, 8192)
    assert (p.herd_m, p.herd_n) == (P.NPU2_COLS, P.NPU2_ROWS)


@pytest.mark.parametrize("s", MODELS, ids=["1b", "3b", "smollm2"])
def test_gemv_plans(s):
    for k, m in _projections(s):
        p = P.plan_gemv(m, k)
        assert m == p.launch_m * p.herd_m * p.rows_per_tile and p.rows_per_tile % p.tile_m == 0 and k % p.k_chunk == 0
        assert p.k_steps == 1 or p.row_steps <= P.SHIM_BD_MAX_ITERATIONS
        assert p.herd_m <= P.NPU2_COLS and p.tile_m <= P.MAX_GEMV_TILE_M and p.k_chunk % P.GEMV_K_MULTIPLE == 0
        assert p.rows_per_tile * P.BF16 % 4 == 0          # one store of whole 32-bit words per tile
        assert p.l1_bytes() <= P.L1_BUDGET
        assert p.steps == 1 or p.steps % 2 == 0           # ping-ponged loop: even trip count


@pytest.mark.parametrize("hidden,ffn", [(576, 1536), (2048, 8192), (3072, 8192), (4096, 14336)])
def test_gemv_large_k(hidden, ffn):
    """K up to 14336 (8B-class down projections): K chunks keep the ping-ponged L1 tiles in budget."""
    for m, k in ((hidden, ffn), (ffn, hidden)):
        p = P.plan_gemv(m, k)
        assert p.l1_bytes() <= P.L1_BUDGET and p.pingpong and p.tile_m >= 2


def test_gemv_l1_counts_pingpong_only_for_streamed_buffers():
    p = P.GemvPlan(m=2048, k=8192, herd_m=8, tile_m=2, k_chunk=4096)
    assert (p.rows_per_tile, p.row_steps, p.k_steps, p.steps) == (256, 128, 2, 2)
    assert p.l1_buffers() == {"w": 2 * 2 * 2 * 4096, "x": 2 * 2 * 4096, "acc_f32": 8, "y": 512}
    one = P.GemvPlan(m=16, k=64, herd_m=8, tile_m=2, k_chunk=64)   # one step per tile: no loop, one copy
    assert one.steps == 1 and not one.pingpong and one.l1_buffers()["w"] == 2 * 2 * 64


@pytest.mark.parametrize("s", MODELS, ids=["1b", "3b", "smollm2"])
@pytest.mark.parametrize("rows", [1] + SEQS)
def test_row_plans(s, rows):
    for g in (0, s.head_dim):
        dim = s.hidden if not g else s.q_dim
        r = P.plan_rmsnorm(rows, dim, g)
        assert r.herd * r.units_per_tile * r.group == rows * dim and r.units_per_tile % r.chunk == 0
        assert r.group == (g or dim) and r.l1_bytes() <= P.L1_BUDGET and r.herd <= P.NPU2_COLS
    for kind, dim in (("add", s.hidden), ("swiglu", s.ffn)):
        e = getattr(P, f"plan_{kind}")(rows, dim)
        assert e.herd * e.units_per_tile == rows * dim and e.units_per_tile % e.chunk == 0
        assert e.chunk % 32 == 0 and e.l1_bytes() <= P.L1_BUDGET and e.herd <= P.NPU2_COLS
        assert e.steps == 1 or e.steps % 2 == 0
    for heads in (s.n_heads, s.n_kv_heads):
        ro = P.plan_rope(rows, heads, s.head_dim)
        covered_rows = ro.herd * ro.rows_per_tile if ro.split == "rows" else ro.rows_per_tile
        covered_heads = ro.heads_per_tile if ro.split == "rows" else ro.herd * ro.heads_per_tile
        assert (covered_rows, covered_heads) == (rows, heads)
        assert ro.rows_per_tile % ro.step_rows == 0 and ro.heads_per_tile % ro.step_heads == 0
        assert ro.l1_bytes() <= P.L1_BUDGET and (ro.steps == 1 or ro.steps % 2 == 0)
    if rows == 1:  # decode: the heads of the one row are spread over tiles when each keeps >= 256 elements
        q = P.plan_rope(1, s.n_heads, s.head_dim)
        assert q.split == "heads" and q.herd * q.heads_per_tile == s.n_heads
        assert q.herd == 1 or q.heads_per_tile * s.head_dim >= P.MIN_ELEMWISE_CHUNK


@pytest.mark.parametrize("s", MODELS, ids=["1b", "3b", "smollm2"])
@pytest.mark.parametrize("seq", SEQS)
def test_attn_plans(s, seq):
    a = P.plan_flash_attn(seq, s.n_heads, s.n_kv_heads, s.head_dim)
    assert seq % a.lq == 0 and a.lq % a.lk == 0 and (seq // a.lq) % a.herd_q == 0
    assert (s.n_heads // s.n_kv_heads) % a.herd_h == 0 and a.herd_q <= 8 and a.herd_h <= 4
    assert a.l1_bytes(s.head_dim) <= P.L1_BUDGET


def test_lm_head_reference_partitioning():
    p = P.plan_lm_head(128256, 2048)
    assert (p.n_parts, p.part_rows) == (8, 16384)
    for vocab, hidden in ((49152, 576), (128256, 3072), (32000, 4096), (100, 576)):
        p = P.plan_lm_head(vocab, hidden)
        assert p.n_parts * p.part_rows >= vocab
        assert p.n_parts * p.part_rows - vocab <= max(vocab // 8, p.n_parts * P.LM_HEAD_ROW_QUANTUM)
        assert p.gemv == P.plan_gemv(p.part_rows, hidden)


@pytest.mark.parametrize("call,words", [
    (lambda: P.plan_gemv(7, 2048), ["gemv", "m=7", "even"]),
    (lambda: P.plan_gemv(2048, 100), ["gemv", "k=100", "multiple of 32"]),
    (lambda: P.plan_gemm(2048, 2048, 100), ["gemm", "n=100", "8x8x8"]),
    (lambda: P.plan_gemm(1, 2048, 2048), ["gemm", "m=1", "gemv"]),
    (lambda: P.plan_rmsnorm(4, 10**6), ["rmsnorm", "dim=1000000", "limit"]),
    (lambda: P.plan_rmsnorm(4, 2064, 48), ["rmsnorm", "group=48", "multiple of 32"]),
    (lambda: P.plan_rmsnorm(4, 2048, 96), ["rmsnorm", "group=96", "does not divide"]),
    (lambda: P.plan_swiglu(4, 8190), ["swiglu", "dim=8190", "multiple of 32"]),
    (lambda: P.plan_rope(4, 8, 63), ["rope", "head_dim=63", "even"]),
    (lambda: P.plan_rope(4, 8, 48), ["rope", "head_dim=48", "multiple of 32"]),
    (lambda: P.plan_flash_attn(64, 30, 8, 64), ["flash_attn", "heads=30", "kv_heads=8"]),
    (lambda: P.plan_flash_attn(64, 32, 8, 65), ["flash_attn", "head_dim=65", "even"]),
    (lambda: P.plan_flash_attn(64, 32, 8, 4096), ["flash_attn", "head_dim=4096", "limit"]),
    (lambda: P.plan_add(0, 2048), ["add", "rows", "positive"]),
    (lambda: P.plan_gemv(-5, 2048), ["gemv", "m", "positive"]),
    (lambda: P.plan_lm_head(128256, 0), ["lm_head", "hidden", "positive"]),
    (lambda: P.plan_gemm(64, 2048.0, 64), ["gemm", "k", "positive int"]),
])
def test_bad_shapes_name_kernel_dimension_and_limit(call, words):
    with pytest.raises(ValueError) as e:
        call()
    for w in words:
        assert w in str(e.value), (w, str(e.value))
