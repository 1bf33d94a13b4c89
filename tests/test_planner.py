"""Tiling plans: every plan fits the NPU2 limits and divides its shape; untileable shapes fail clearly."""
from __future__ import annotations

import pytest

from kernel_builder.hw import cost

from kernel_builder import planner as P
from kernel_builder.add import plan as add_plan
from kernel_builder.attention import plan as A
from kernel_builder.gemm import plan as G
from kernel_builder.gemv import external as gemv_ext, plan as gemv_plan
from kernel_builder.rmsnorm import plan as rmsnorm_plan
from kernel_builder.rope import plan as rope_plan
from kernel_builder.swiglu import plan as swiglu_plan
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
        p = G.plan_gemm(seq, k, n)
        assert seq % p.bm == 0 and n % p.bn == 0
        assert k % p.tile_k_l2 == 0 and p.tile_k_l2 % p.tile_k == 0 and p.tile_k_l2 <= G.MAX_GEMM_L2_K
        assert p.tile_m % 8 == 0 and p.tile_n % 16 == 0 and p.tile_k % 8 == 0  # micro-kernel blocks
        assert 1 <= p.herd_m <= P.NPU2_COLS and 1 <= p.herd_n <= P.NPU2_ROWS
        assert p.l1_bytes() <= P.L1_BUDGET
        # every L2 buffer is its own allocation; the fullest memory tile still fits
        l2, c = p.l2_buffers(), p.copies(p.tile_k_l2)
        # (a resident A panel: the whole [tile_m, k], one copy; its C row panels: one copy, out of the drain loop)
        a_cols = k if p.a_resident else c * p.tile_k_l2
        assert l2 == {"a_panel": P.BF16 * p.tile_m * a_cols, "w_panel": c * P.BF16 * p.tile_n * p.tile_k_l2,
                      "c_panel": P.BF16 * p.tile_m * p.bn}
        assert max(l2.values()) <= p.memtile_bytes() <= P.MEMTILE_BYTES
        # memory-tile BDs: each panel broadcast within its budget, the busiest tile within 48
        bds = p.memtile_bds()
        assert max(bds["a_put"], bds["w_put"]) <= G.MAX_GEMM_PUT_BDS and p.memtile_bd_total() <= G.MEMTILE_BDS
        # the W block stride folded into a shim BD under runtime loop tiling fits its 20-bit word count
        assert p.launch_n() * k <= G.SHIM_MAX_STRIDE_BF16
        # channel budget: <= 2 MM2S + 2 S2MM per shim column, <= 6 S2MM / MM2S per memory tile, 2 + 1 per core
        ch = p.channels()
        assert ch["shim_mm2s"] <= 2 * P.NPU2_COLS and ch["shim_s2mm"] <= 2 * P.NPU2_COLS
        assert ch["memtile_s2mm"] <= G.MEMTILE_DMA_CHANNELS and ch["memtile_mm2s"] <= G.MEMTILE_DMA_CHANNELS
        assert (ch["core_s2mm"], ch["core_mm2s"]) == (2, 1)


def test_gemm_ping_pong_copies_follow_the_trip_counts(monkeypatch):
    """aircc's ping-pong transform gives a loop of one trip no copy, an even trip count two, and (in the mlir-air
    the lowering toolchain builds) an odd one a third: the plan budgets L1 and L2 accordingly."""
    even = G.GemmPlan(64, 64, 64, 8, 4, 512, k=2048)     # 32 herd steps, 4 panel steps
    odd = G.GemmPlan(64, 64, 48, 8, 4, 192, k=576)       # 9 herd steps, 3 panel steps
    one = G.GemmPlan(64, 64, 64, 8, 4, 512, k=512)       # 8 herd steps, 1 panel step
    assert (even.copies(64), even.copies(512)) == (2, 2)
    assert (odd.copies(64), odd.copies(192)) == (3, 3)
    assert one.copies(512) == 1 and one.l2_buffers()["a_panel"] == P.BF16 * 64 * 512
    assert odd.l1_buffers()["a_tiles"] == 3 * P.BF16 * 64 * 64
    # 64x1536x576: panel depth 512 would be 3 steps x 8 slices = 24 BDs for the W broadcast (what aiecc's
    # aie-assign-bd-ids rejected); the streamed plan takes 384 (4 steps, 2 copies x 6 slices)
    monkeypatch.setattr(G, "A_RESIDENT", False)
    p = G.plan_gemm(64, 1536, 576)
    assert p.tile_k_l2 == 384 and p.memtile_bds()["w_put"] == 12
    assert G.GemmPlan(8, 64, 48, 8, 4, 512, k=1536).memtile_bds()["w_put"] == 24 > G.MAX_GEMM_PUT_BDS


def test_gemm_l1_accounting_covers_every_herd_buffer():
    p = G.GemmPlan(tile_m=64, tile_k=64, tile_n=64, herd_m=8, herd_n=4)
    # f32 acc 16 KiB + 2x A 8 KiB + 2x W 8 KiB + the A tile in block float (64 blocks x 72 B); the epilogue
    # writes the bf16 tile in place over the accumulator
    assert p.l1_buffers() == {"acc_f32": 16384, "a_tiles": 16384, "w_tiles": 16384, "a_bfp16": 4608, "bias": 0}
    assert p.l1_bytes() == 48 * 1024 + 4608 <= P.L1_BUDGET
    assert G.GemmPlan(128, 64, 64, 1, 1).l1_bytes() > P.L1_BUDGET  # 32+32+16+9 KiB
    # 64x128 at tile_k 32 fits now (it needed 16 KiB more for a separate bf16 output tile); 128x64 does not (its
    # block-float A copy is twice as large)
    assert G.GemmPlan(64, 32, 128, 8, 4).l1_bytes() == 56 * 1024 + 2304 <= P.L1_BUDGET
    assert G.GemmPlan(128, 32, 64, 8, 4).l1_bytes() == 56 * 1024 + 4608 > P.L1_BUDGET
    assert G.GemmPlan(64, 64, 64, 8, 4, epilogue="bias").l1_buffers()["bias"] == 64 * P.BF16


def test_gemm_l2_accounting_channels_and_ddr_reads():
    p = G.GemmPlan(tile_m=64, tile_k=64, tile_n=64, herd_m=8, herd_n=4, tile_k_l2=512)
    # A panel 64x512 bf16 = 64 KiB and W panel 64x512 = 64 KiB, each double-buffered; C row panel 64x256
    assert p.l2_buffers() == {"a_panel": 128 * 1024, "w_panel": 128 * 1024, "c_panel": 32 * 1024}
    assert p.l2_counts() == {"a_panel": 8, "w_panel": 4, "c_panel": 8}
    assert p.l2_bytes() == 8 * 128 * 1024 + 4 * 128 * 1024 + 8 * 32 * 1024
    # AIR's placement (kernel_builder.hw.memtile_place): A panel i and C row panel i on memory tile i (their
    # channels reach only column i), W panel j beside them on tile j: 128 + 128 + 32 KiB on tiles 0-3
    assert p.memtile_placement()[0] == [("a", 0), ("w", 0), ("c", 0)]
    assert p.memtile_placement()[7] == [("a", 7), ("c", 7)]
    # bytes: the larger of that placement's 288 KiB and the earlier bound, 3 x 128 KiB (the lowered plans' rule)
    assert p.memtile_bytes() == 384 * 1024
    # 8 A + 4 W panels in, 8 C row panels out per launch point; a memory tile takes A + W + 4 drains
    assert p.channels() == {"shim_mm2s": 12, "shim_s2mm": 8, "memtile_s2mm": 6, "memtile_mm2s": 3,
                            "core_s2mm": 2, "core_mm2s": 1}
    # 2048x2048x8192: A (8 MiB) read 8192/256 = 32 times, W (32 MiB) 2048/512 = 4 times
    assert p.ddr_read_bytes(2048, 2048, 8192) == 32 * 8 * 2**20 + 4 * 32 * 2**20
    # the W panel loaded in two row parts (gemm_swiglu): 8 + 8 shim streams (every column's two MM2S channels), but
    # AIR puts W panel j (2 loads in) beside A panel j and C row panel j (4 drains): 7 S2MM on memory tiles 0-3,
    # as the real lowering does (aie-create-pathfinder-flows fails; tests/test_air_lower_gemm.py)
    two = G.GemmPlan(tile_m=64, tile_k=64, tile_n=64, herd_m=8, herd_n=4, tile_k_l2=512, w_parts=2)
    assert two.l2_buffers()["w_panel"] == 128 * 1024 and two.l2_counts()["w_panel"] == 4
    assert two.channels()["shim_mm2s"] == 16 and two.memtile_channels() == (7, 3)
    # on a 4-column herd the W panels get memory tiles 4-7 of their own: 5 S2MM at most
    four = G.GemmPlan(tile_m=16, tile_k=64, tile_n=128, herd_m=4, herd_n=4, tile_k_l2=512, w_parts=2)
    assert four.memtile_channels() == (5, 2) and four.memtile_placement()[4] == [("w", 0)]
    assert [k for k, _, _ in G.load_order(two)] == list("aaaawwwwwwwwaaaa")
    assert not G._gemm_fits(two, 2048)
    # swiglu: tile_n covers tile_n/2 outputs (gate and up rows interleaved in one weight), so a launch point
    # writes half the columns; one W load per panel, two W rows per output column
    glu = G.GemmPlan(tile_m=64, tile_k=64, tile_n=64, herd_m=8, herd_n=4, epilogue="swiglu")
    assert (glu.out_n, glu.bn_out, glu.l2_buffers()["c_panel"]) == (32, 128, P.BF16 * 64 * 128)
    assert (glu.w_parts, glu.w_per_out, glu.memtile_channels()) == (1, 2, (6, 3))
    assert G.GemmPlan(64, 64, 64, 8, 4).tile_k_l2 == 64  # default: one L1 step per L2 panel
    with pytest.raises(ValueError, match="tile_k_l2=96 is not a multiple of tile_k=64"):
        G.GemmPlan(64, 64, 64, 8, 4, 96)


def test_gemm_plan_is_the_cost_models_fastest(monkeypatch):
    """The planner ranks fitting plans by the cost model's time (modeled_seconds, rounded to 0.1 %), then deeper
    tile_k: at 2048x2048x8192 it leaves the 64x64 tile for 64x128 at tile_k 32 (BN 512: A read from DDR 16 times,
    not 32; the A and W loads interleaved over the shim columns), which the hardware model times faster."""
    from kernel_builder.gemm import builder
    from kernel_builder.hw import analyze_module

    # the streamed plans (A re-read per column block); the A-resident ones: tests/test_gemm_resident.py
    monkeypatch.setattr(G, "A_RESIDENT", False)
    big = G.plan_gemm(2048, 2048, 8192)
    assert (big.tile_m, big.tile_n, big.tile_k, big.herd_m, big.herd_n, big.w_parts) == (64, 128, 32, 8, 4, 1)
    old = G._deepest_l2_panel(G.GemmPlan(64, 64, 64, 8, 4, k=2048), 2048)
    assert big.ddr_read_bytes(2048, 2048, 8192) < 0.7 * old.ddr_read_bytes(2048, 2048, 8192)
    assert G.modeled_seconds(big, 2048, 2048, 8192) < 0.85 * G.modeled_seconds(old, 2048, 2048, 8192)
    # the closed form is the hardware model's figure for the built module (up to the ELF factor + overhead)
    work = analyze_module(builder.build(2048, 2048, 8192), "g").launches[0].work
    got = cost.launch_cost(work, elf=False)
    assert abs(max(got.compute_s, got.dma_s) / G.modeled_seconds(big, 2048, 2048, 8192) - 1) < 0.02
    # the L1 term: the busier of a core's two input streams (A and W on their own S2MM channels), as the analyzer
    points = (2048 // big.bm) * (8192 // big.bn_out)
    assert work.tile_l1_in_bytes == 2 * max(big.tile_m, big.tile_n) * 2048 * points
    for shape in ((2048, 576, 576), (2048, 8192, 2048), (64, 2048, 8192)):
        p = G.plan_gemm(*shape)
        for cand in (G.GemmPlan(64, 64, 64, 8, 4, k=shape[1]), G.GemmPlan(32, 32, 32, 8, 4, k=shape[1]),
                     G.GemmPlan(64, 16, 128, 8, 4, k=shape[1])):
            if shape[0] % cand.bm == 0 and shape[2] % cand.bn == 0 and G._gemm_fits(cand, shape[1]):
                assert G.modeled_seconds(p, *shape) <= G.modeled_seconds(cand, *shape) * 1.001
        assert p.tile_k_l2 == max(d for d in range(p.tile_k, G.MAX_GEMM_L2_K + 1, p.tile_k)
                                  if shape[1] % d == 0 and G._gemm_fits(G.GemmPlan(p.tile_m, p.tile_k, p.tile_n,
                                                                                   p.herd_m, p.herd_n, d, shape[1],
                                                                                   p.w_parts, spread=p.spread,
                                                                                   a_resident=p.a_resident),
                                                                        shape[1]))


def test_gemm_uses_full_array_for_llama_prefill():
    for m in (64, 256, 1024, 2048):
        p = G.plan_gemm(m, 2048, 8192)
        assert (p.herd_m, p.herd_n) == (P.NPU2_COLS, P.NPU2_ROWS), m


@pytest.mark.parametrize("s", MODELS, ids=["1b", "3b", "smollm2"])
def test_gemv_plans(s):
    for k, m in _projections(s):
        p = gemv_plan.plan_gemv(m, k)
        assert m == p.tiles * p.rows_per_tile and p.rows_per_tile % p.tile_m == 0 and k % p.k_chunk == 0
        assert p.tiles == gemv_plan.GEMV_MAX_TILES and (p.herd_x, p.herd_y) == (P.NPU2_COLS, 2)   # 16 weight streams
        assert p.contiguous_stream and p.core_task_repeats <= gemv_plan.CORE_TASK_MAX_REPEATS
        assert p.tile_m <= gemv_plan.MAX_GEMV_TILE_M and p.k_chunk % gemv_ext.GEMV_K_MULTIPLE == 0
        assert p.rows_per_tile * P.BF16 % 4 == 0          # one store of whole 32-bit words per tile
        assert p.l1_bytes() <= P.L1_BUDGET
        assert p.steps == 1 or p.steps % 2 == 0           # ping-ponged loop: even trip count


@pytest.mark.parametrize("hidden,ffn", [(576, 1536), (2048, 8192), (3072, 8192), (4096, 14336)])
def test_gemv_large_k(hidden, ffn):
    """K up to 14336 (8B-class down projections): x stays whole in L1; K chunks (one row per step, so the
    weight stream stays one contiguous run) keep the ping-ponged weight block in budget."""
    for m, k in ((hidden, ffn), (ffn, hidden)):
        p = gemv_plan.plan_gemv(m, k)
        assert p.l1_bytes() <= P.L1_BUDGET and p.pingpong and p.contiguous_stream
    p = gemv_plan.plan_gemv(4096, 14336)
    assert p.k_steps > 1 and p.tile_m == 1


def test_gemv_herds_and_limits(monkeypatch):
    """Tiles: the most (<= 16, two per shim column) that leave an even number of rows per tile; up to 8 in one
    herd row, else two rows. A tile's weight blocks fit one core DMA task (256 runs of the ping-pong pair)."""
    assert [gemv_plan.gemv_herd_shape(t) for t in (1, 8, 10, 16)] == [(1, 1), (8, 1), (5, 2), (8, 2)]
    assert gemv_plan.gemv_herd_shape(9) is None and gemv_plan.gemv_herd_shape(18) is None
    assert (gemv_plan.plan_gemv(20, 64).herd_x, gemv_plan.plan_gemv(20, 64).herd_y) == (5, 2)   # 10 tiles of 2 rows
    assert gemv_plan.plan_gemv(6, 64).tiles == 3                                       # 2 rows each
    assert gemv_plan.plan_gemv(32768, 2048).core_task_repeats == 256                   # at the limit: 2048 rows per tile
    with pytest.raises(ValueError, match="core DMA task repeats"):
        gemv_plan.plan_gemv(65536, 2048)
    monkeypatch.setattr(gemv_plan, "CORE_TASK_MAX_REPEATS", 4)
    p = gemv_plan.plan_gemv(512, 2048)   # 32 rows per tile: at most 4 runs of 2 steps -> 4 rows per step
    assert p.core_task_repeats <= 4 and p.tile_m == 4


def test_gemv_l1_counts_pingpong_only_for_streamed_buffers():
    p = gemv_plan.GemvPlan(m=2048, k=8192, herd_x=8, herd_y=2, tile_m=1, k_chunk=4096)
    assert (p.rows_per_tile, p.row_steps, p.k_steps, p.steps) == (128, 128, 2, 2)
    assert p.l1_buffers() == {"w": 2 * 2 * 4096, "x": 2 * 8192, "acc_f32": 4, "y": 256}
    assert p.stream_bytes() == 2 * (8192 + 128 * 8192)
    one = gemv_plan.GemvPlan(m=32, k=64, herd_x=8, herd_y=2, tile_m=2, k_chunk=64)   # one step per tile: no loop, one copy
    assert one.steps == 1 and not one.pingpong and one.l1_buffers()["w"] == 2 * 2 * 64


@pytest.mark.parametrize("s", MODELS, ids=["1b", "3b", "smollm2"])
@pytest.mark.parametrize("rows", [1] + SEQS)
def test_row_plans(s, rows):
    for g in (0, s.head_dim):
        dim = s.hidden if not g else s.q_dim
        r = rmsnorm_plan.plan_rmsnorm(rows, dim, g)
        assert r.herd * r.units_per_tile * r.group == rows * dim and r.units_per_tile % r.chunk == 0
        assert r.group == (g or dim) and r.l1_bytes() <= P.L1_BUDGET and r.herd <= P.NPU2_COLS
    for plan, dim in ((add_plan.plan_add, s.hidden), (swiglu_plan.plan_swiglu, s.ffn)):
        e = plan(rows, dim)
        assert e.herd * e.units_per_tile == rows * dim and e.units_per_tile % e.chunk == 0
        assert e.chunk % 32 == 0 and e.l1_bytes() <= P.L1_BUDGET and e.herd <= P.NPU2_COLS
        assert e.steps == 1 or e.steps % 2 == 0
    for heads in (s.n_heads, s.n_kv_heads):
        ro = rope_plan.plan_rope(rows, heads, s.head_dim)
        covered_rows = ro.herd * ro.rows_per_tile if ro.split == "rows" else ro.rows_per_tile
        covered_heads = ro.heads_per_tile if ro.split == "rows" else ro.herd * ro.heads_per_tile
        assert (covered_rows, covered_heads) == (rows, heads)
        assert ro.rows_per_tile % ro.step_rows == 0 and ro.heads_per_tile % ro.step_heads == 0
        assert ro.l1_bytes() <= P.L1_BUDGET and (ro.steps == 1 or ro.steps % 2 == 0)
    if rows == 1:  # decode: the heads of the one row are spread over tiles when each keeps >= 256 elements
        q = rope_plan.plan_rope(1, s.n_heads, s.head_dim)
        assert q.split == "heads" and q.herd * q.heads_per_tile == s.n_heads
        assert q.herd == 1 or q.heads_per_tile * s.head_dim >= P.MIN_ELEMWISE_CHUNK


def _check_attention_plan(p, s, rows, window):
    g = s.n_heads // s.n_kv_heads
    assert p.l1_bytes() <= P.L1_BUDGET
    assert all(b <= P.MEMTILE_BYTES for b in p.l2_buffers().values()) and p.l2_bytes() <= P.L2_BUDGET
    assert p.herd_x <= P.NPU2_COLS and p.herd_y <= P.NPU2_ROWS and p.cores <= P.NPU2_COLS * P.NPU2_ROWS
    ch = p.channels()
    assert ch["shim_mm2s"] <= A.SHIM_MM2S and ch["shim_s2mm"] <= A.SHIM_S2MM
    assert ch["core_s2mm"] <= 2 and ch["core_mm2s"] <= 2 and p.core_bds() <= 16
    assert window % p.lk == 0 and p.lk % A.ATTN_LK_MULTIPLE == 0
    if p.decode:
        assert p.lq == g and p.kv_rows % (p.herd_x * p.lk) == 0 and s.n_kv_heads % p.herd_y == 0
        assert p.launch_grid == (s.n_kv_heads // p.herd_y,)
        # a split's L2 item: K, V and q DMAs in, one put per kv head out; a kv head's partials: herd_x in
        assert 3 <= A.MEMTILE_CHANNELS and p.herd_y <= A.MEMTILE_CHANNELS and p.herd_x <= A.MEMTILE_CHANNELS
        assert p.cores == p.herd_x * p.herd_y + p.herd_y
    else:
        assert rows % (p.lq * p.herd_x) == 0 and p.lq % A.ATTN_LQ_MULTIPLE == 0 and g % p.herd_y == 0
        assert p.lk <= p.lq <= 2 * p.lk
        assert p.launch_grid == (s.n_kv_heads, p.rounds, p.head_passes)
        # every query block of every head is computed exactly once
        assert p.iterations * p.herd_x * p.herd_y * p.lq == rows * s.n_heads
        # the Q items hold the round's rows of every head: whole items per head (or one item, half repeated)
        assert p.q_items >= p.herd_y * p.q_items_per_head
        assert p.q_items_per_head * 2 * p.lk == p.herd_x * p.lq or p.herd_x * p.lq == p.lk
        # the interleaved 8-row blocks balance the causal work of a first chunk of 2048+ rows within 5 %
        if rows >= 2048 and window == rows:
            assert p.balance() <= 1.05, p.balance()
        # a query block's L2 output buffer gathers herd_y tiles (memory-tile S2MM channels) and holds them
        assert p.herd_y <= A.MEMTILE_CHANNELS and p.l2_buffers()["out0"] == 2 * p.lq * p.herd_y * p.head_dim


@pytest.mark.parametrize("s", MODELS, ids=["1b", "3b", "smollm2"])
@pytest.mark.parametrize("seq", SEQS)
def test_attention_prefill_plans(s, seq):
    for window in (seq, 8192):          # the first chunk; a chunk over a KV prefix (chunked prefill)
        _check_attention_plan(A.plan_attention(seq, window, s.n_heads, s.n_kv_heads, s.head_dim), s, seq, window)


@pytest.mark.parametrize("s", MODELS, ids=["1b", "3b", "smollm2"])
@pytest.mark.parametrize("window", [256, 2048, 8192, 32768])
def test_attention_decode_plans(s, window):
    _check_attention_plan(A.plan_attention(1, window, s.n_heads, s.n_kv_heads, s.head_dim), s, 1, window)


@pytest.mark.parametrize("s", MODELS, ids=["1b", "3b", "smollm2"])
def test_attention_decode_refuses_windows_past_the_repeat_count(s):
    """131072 positions need 512 K/V tiles per split: the query rows' shim task would repeat past 255
    (aie-dma-tasks-to-npu), so no decode plan exists and the planner says why in one line."""
    with pytest.raises(ValueError, match="256 K/V tiles per split"):
        A.plan_attention(1, 131072, s.n_heads, s.n_kv_heads, s.head_dim)


def test_attention_plans_use_the_array():
    """Prefill: 8 query blocks x 4 heads on all 32 cores; one broadcast item stream (two feed streams) and the
    output drained through L2, one S2MM stream per query block; the counted cycles of the busiest core per item
    pick 32-key tiles; the cores' interleaved 8-row blocks balance the causal work (busiest / mean 1.015 at 2048,
    1.008 at 4096; contiguous query blocks per core gave ~1.2). Decode splits the window over 4 cores per kv head, 4 kv heads side by side (3 streams per split)."""
    s = LLAMA32_1B
    p = A.plan_attention(2048, 2048, s.n_heads, s.n_kv_heads, s.head_dim)
    assert (p.lq, p.lk, p.herd_x, p.herd_y, p.cores, p.rounds) == (64, 32, 8, 4, 32, 4)
    assert p.channels()["shim_mm2s"] == 3 and p.channels()["shim_s2mm"] == 8
    assert p.balance() == pytest.approx(1.015, abs=0.001)
    assert A.plan_attention(4096, 4096, s.n_heads, s.n_kv_heads, s.head_dim).balance() == pytest.approx(1.008, abs=0.001)
    p = A.plan_attention(64, 64, s.n_heads, s.n_kv_heads, s.head_dim)
    assert (p.lq, p.lk, p.herd_x, p.cores) == (16, 16, 4, 16)
    d = A.plan_attention(1, 2048, s.n_heads, s.n_kv_heads, s.head_dim)
    assert (d.herd_x, d.herd_y, d.lq, d.cores, d.lk) == (4, 4, 4, 20, 64)
    assert d.launch_grid == (2,) and d.channels()["shim_mm2s"] == 13


def test_lm_head_reference_partitioning():
    p = gemv_plan.plan_lm_head(128256, 2048)
    assert (p.n_parts, p.part_rows) == (8, 16384)
    for vocab, hidden in ((49152, 576), (128256, 3072), (32000, 4096), (100, 576)):
        p = gemv_plan.plan_lm_head(vocab, hidden)
        assert p.n_parts * p.part_rows >= vocab
        assert p.n_parts * p.part_rows - vocab <= max(vocab // 8, p.n_parts * gemv_plan.LM_HEAD_ROW_QUANTUM)
        assert p.gemv == gemv_plan.plan_gemv(p.part_rows, hidden)


@pytest.mark.parametrize("call,words", [
    (lambda: gemv_plan.plan_gemv(7, 2048), ["gemv", "m=7", "even"]),
    (lambda: gemv_plan.plan_gemv(2048, 100), ["gemv", "k=100", "multiple of 32"]),
    (lambda: gemv_plan.plan_gemv(64, 40000), ["gemv", "k=40000", "KiB", "split k"]),
    (lambda: gemv_plan.plan_gemv(65536, 2048), ["gemv", "m=65536", "256", "split m"]),
    (lambda: G.plan_gemm(2048, 2048, 100), ["gemm", "n=100", "multiple of 16", "8x8x8"]),
    (lambda: G.plan_gemm(1, 2048, 2048), ["gemm", "m=1", "gemv"]),
    (lambda: rmsnorm_plan.plan_rmsnorm(4, 10**6), ["rmsnorm", "dim=1000000", "limit"]),
    (lambda: rmsnorm_plan.plan_rmsnorm(4, 2064, 48), ["rmsnorm", "group=48", "multiple of 32"]),
    (lambda: rmsnorm_plan.plan_rmsnorm(4, 2048, 96), ["rmsnorm", "group=96", "does not divide"]),
    (lambda: swiglu_plan.plan_swiglu(4, 8190), ["swiglu", "dim=8190", "multiple of 32"]),
    (lambda: rope_plan.plan_rope(4, 8, 63), ["rope", "head_dim=63", "even"]),
    (lambda: rope_plan.plan_rope(4, 8, 48), ["rope", "head_dim=48", "multiple of 32"]),
    (lambda: A.plan_attention(64, 64, 30, 8, 64), ["attention", "heads=30", "kv_heads=8"]),
    (lambda: A.plan_attention(64, 64, 32, 8, 65), ["attention", "head_dim=65", "even"]),
    (lambda: A.plan_attention(64, 64, 32, 8, 4096), ["attention", "head_dim=4096", "KiB"]),
    (lambda: A.plan_attention(1, 4096 * 64, 32, 8, 4096), ["attention", "decode", "KiB"]),
    (lambda: A.plan_attention(64, 32, 32, 8, 64), ["attention", "rows=64", "kv_rows=32"]),
    (lambda: add_plan.plan_add(0, 2048), ["add", "rows", "positive"]),
    (lambda: gemv_plan.plan_gemv(-5, 2048), ["gemv", "m", "positive"]),
    (lambda: gemv_plan.plan_lm_head(128256, 0), ["lm_head", "hidden", "positive"]),
    (lambda: G.plan_gemm(64, 2048.0, 64), ["gemm", "k", "positive int"]),
])
def test_bad_shapes_name_kernel_dimension_and_limit(call, words):
    with pytest.raises(ValueError) as e:
        call()
    for w in words:
        assert w in str(e.value), (w, str(e.value))


def test_gemm_planner_follows_the_cost_descriptor(monkeypatch):
    """modeled_seconds counts the micro-kernel's calls through its cost descriptor: a descriptor that charges each
    mac call 8x its accumulator stores moves 2048x2048x8192 from tile_k 32 to a deeper tile_k."""
    import dataclasses

    from kernel_builder import external_costs as EC   # tile_counts counts the calls through EC.call_counts

    real = EC.external_cost

    def with_acc_traffic(symbol):
        desc, match = real(symbol)
        if match.group(1) != "mac":
            return desc, match
        tm, tn = int(match.group(2)), int(match.group(4))
        def work(mt, args):
            w = desc.work(mt, args)
            return dataclasses.replace(w, counts={**w.counts, "vstore": w.counts.get("vstore", 0) + tm * tn // 2})
        return dataclasses.replace(desc, work=work), match

    monkeypatch.setattr(G, "A_RESIDENT", False)   # the streamed plans (the resident one already takes tile_k 64)
    assert G.plan_gemm(2048, 2048, 8192).tile_k == 32
    monkeypatch.setattr(EC, "external_cost", with_acc_traffic)
    assert G.plan_gemm(2048, 2048, 8192).tile_k == 64
