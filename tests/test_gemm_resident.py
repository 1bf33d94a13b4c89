"""The GEMM with A resident in L2 (GemmPlan.a_resident, kernel_builder/gemm/builder.py `_resident`): one launch
point per BM rows, each herd row's whole [tile_m, k] A panel loaded once into its memory tile, the W panels and
the C row panels stepping through the column blocks. Chosen by the planner where the cost model times it faster
(the 1B prefill's Q/O and gate/up GEMMs: A read from DDR once instead of n / bn_out times)."""
from __future__ import annotations

from unittest import mock

import numpy as np
import pytest

from kernel_builder.gemm import builder as gemm_builder
from kernel_builder.gemm import plan as gp
from kernel_builder.hw import analyze_module
from kernel_builder.numerics import BF16
from multi_launch_builder.emulator import air_interp

SMALL = gp.GemmPlan(tile_m=16, tile_k=64, tile_n=64, herd_m=8, herd_n=4, tile_k_l2=128, k=256, a_resident=True)


def _build(p: gp.GemmPlan, m: int, k: int, n: int) -> str:
    with mock.patch.object(gp, "plan_gemm", lambda *a, **kw: p):
        return gemm_builder.build(m, k, n)


def test_planner_keeps_a_resident_for_the_big_prefill_gemms(monkeypatch):
    # on by default (gemm/plan.py A_RESIDENT: the real lowering of the pre-blocked, flat-loop module passes)
    for shape, epi in (((2048, 2048, 8192), "none"), ((2048, 2048, 2048), "none"), ((4096, 2048, 8192), "none"),
                       ((2048, 2048, 8192), "swiglu")):
        p = gp.plan_gemm(*shape, epi)
        assert p.a_resident, (shape, p)
        m, k, n = shape
        # A read once, W once per BM row block
        assert p.ddr_read_bytes(m, k, n) == 2 * (m * k + p.w_per_out * k * n * (m // p.bm))
        # memory tiles 0-3: the resident A panel, its C row panel and a W panel (two copies) within 512 KiB
        assert p.memtile_placement()[0] == [("a", 0), ("w", 0), ("c", 0)] and p.memtile_bytes() <= 512 * 1024
        # pre-blocked panels: one BD per A broadcast, one per W copy (the slice loops fold)
        assert p.memtile_bds()["a_put"] == 1 and p.memtile_bds()["w_put"] == p.copies(p.tile_k_l2)
    monkeypatch.setattr(gp, "A_RESIDENT", False)
    assert not gp.plan_gemm(2048, 2048, 8192).a_resident
    monkeypatch.setattr(gp, "A_RESIDENT", True)
    # k = 8192 (down): a [64, 8192] panel is 1 MiB, more than a memory tile; 64 rows: no gain, not chosen
    assert not gp.plan_gemm(2048, 8192, 2048).a_resident and not gp.plan_gemm(64, 2048, 8192).a_resident
    with pytest.raises(ValueError, match="resident"):
        gp.GemmPlan(64, 64, 64, 8, 4, k=2048, spread=True, a_resident=True)


def test_resident_module_fits_and_streams_w_alone_on_four_shim_columns():
    # the W stream: launch-level puts on @gemm_w[j]; the shim allocator starts each at its get's memory-tile column
    # (the real lowering: W panel j from shim column j beside A panel j), as the analyzer now does by default
    rep = analyze_module(gemm_builder.build(2048, 2048, 8192))
    assert rep.ok, rep.first_violation()
    la = rep.launches[0]
    assert la.work.l2_placement[0] == ["%a_l2", "%w_l2", "%c_l2"] and la.work.l2_placement[7] == ["%a_l2_7", "%c_l2_7"]
    mm2s = [f for f in la.work.flows if f.direction == "MM2S"]
    w = [f for f in mm2s if "%arg1" in f.what]
    assert sorted(f.column for f in w) == [0, 1, 2, 3] and all(f.bytes == 8192 * 2048 * 2 * 4 // 4 for f in w)
    assert sum(f.bytes for f in mm2s if "%arg0" in f.what) == 2048 * 2048 * 2     # A once


def test_resident_gemm_result_and_traffic_on_the_interpreter():
    m, k, n = 128, 256, 512      # 1 launch point, 2 column blocks, 2 L2 K steps
    text = _build(SMALL, m, k, n)
    assert analyze_module(text).ok
    rng = np.random.default_rng(5)
    a = (rng.standard_normal((m, k)) * 0.5).astype(BF16)
    w = (rng.standard_normal((n, k)) * 0.5).astype(BF16)
    c = np.zeros((m, n), BF16)
    stats = air_interp.compile_module(text).run([a, w, c])
    blocks, tiles = n // SMALL.bn_out, SMALL.herd_m * SMALL.herd_n
    # DMAs: A once (its resident panels) and C; the W panels stream from the launch on @gemm_w (channel puts:
    # W once per row block from L3, again slice by slice to the cores, the A slices per column block, the C tiles)
    assert stats.dma_bytes == 2 * m * k + 2 * m * n
    assert stats.channel_put_bytes == 2 * m * k * blocks + 2 * 2 * n * k * (m // SMALL.bm) + 2 * m * n
    assert SMALL.ddr_read_bytes(m, k, n) == 2 * m * k + 2 * n * k * (m // SMALL.bm)
    assert stats.calls_by_symbol[f"gemm_zero_bf16_m16_k64_n64"] == blocks * tiles
    ref = a.astype(np.float32) @ w.astype(np.float32).T
    got = c.astype(np.float32)
    # bf16 output of an f32 accumulation: within 2 bf16 ulps of the f32 product (plus a small absolute floor)
    assert np.all(np.abs(got - ref) <= 2 * 2.0 ** -7 * np.abs(ref) + 1e-2), np.max(np.abs(got - ref))


def test_resident_gemm_swiglu_on_the_interpreter():
    # the fused gate/up launch with A resident: the launch streams the interleaved [2n, k] weight, 2 * bn_out rows
    # per column block; each tile's epilogue applies swiglu to its (gate, up) column pairs
    from kernel_builder.gemm_swiglu.reference import gemm_swiglu
    p = gp.GemmPlan(tile_m=16, tile_k=64, tile_n=64, herd_m=8, herd_n=4, tile_k_l2=128, k=256, epilogue="swiglu",
                    a_resident=True)
    m, k, n = 128, 256, 256      # 1 launch point, 2 column blocks of bn_out = 128 outputs, 2 L2 K steps
    with mock.patch.object(gp, "plan_gemm", lambda *a, **kw: p):
        text = gemm_builder.build(m, k, n, "swiglu")
    assert analyze_module(text).ok
    rng = np.random.default_rng(7)
    a = (rng.standard_normal((m, k)) * 0.5).astype(BF16)
    w = (rng.standard_normal((2 * n, k)) * 0.5).astype(BF16)
    c = np.zeros((m, n), BF16)
    stats = air_interp.compile_module(text).run([a, w, c])
    assert stats.dma_bytes == 2 * m * k + 2 * m * n                      # A once, C (the weight: on @gemm_w)
    blocks = n // p.bn_out
    assert stats.channel_put_bytes == 2 * m * k * blocks + 2 * 2 * (2 * n) * k * (m // p.bm) + 2 * m * n
    ref = gemm_swiglu(a, w, m=m, k=k, n=n).astype(np.float32)
    got = c.astype(np.float32)
    assert np.all(np.abs(got - ref) <= 2 * 2.0 ** -7 * np.abs(ref) + 2e-2), np.max(np.abs(got - ref))
    # an off-by-one column block in the W stream would give another block's outputs: the blocks differ
    assert not np.allclose(got[:, :128], got[:, 128:])


def _row_major_resident(m: int, k: int, n: int) -> str:
    """The deliberately broken A-resident GEMM (its first form): row-major L2 panels, so every A / W slice is the
    4-dim [rows/8][tile_k/8][8][8] pattern that no loop can fold into."""
    p = gp.GemmPlan(tile_m=64, tile_k=32, tile_n=64, herd_m=8, herd_n=4, tile_k_l2=512, k=k, a_resident=True)
    with mock.patch.object(gp, "plan_gemm", lambda *a, **kw: p), \
            mock.patch.object(gemm_builder, "_preblocked", lambda rows, cols: None), \
            mock.patch.object(gemm_builder, "_slice", gemm_builder._blocked):
        return gemm_builder.build(m, k, n)


def test_unfoldable_slices_in_column_block_loops_are_refused():
    # the real lowering (mlir-air efeb41ce4): "'aie.memtile_dma' op has more than 48 blocks" at 512x1024x1024 (A
    # broadcast: 4 column blocks x 32 slices = 128 BDs); at 2048x2048x8192 its AIR stage did not finish
    rep = analyze_module(_row_major_resident(512, 1024, 1024))
    assert not rep.ok
    v = next(v for v in rep.violations if v.resource == "BD chain")
    assert (v.tile, v.used, v.available, v.kind) == ("memtile", 128, 48, "rule")
    assert "%a_l2" in v.detail and "more than 48 blocks" in v.detail
    # the pre-blocked module of the same shape folds every slice loop: one BD per A broadcast
    assert analyze_module(_build(gp.GemmPlan(64, 32, 64, 8, 4, tile_k_l2=512, k=1024, a_resident=True),
                                 512, 1024, 1024)).ok


def test_engine_with_resident_gemms_on_the_interpreter(tmp_path, monkeypatch):
    # every prefill GEMM of a tiny model forced onto the A-resident plan where it fits (the planner picks it only
    # at larger shapes): the stitched modules (channels renamed per launch, the launch-level W stream included)
    # give emu-interp the tokens and logits of the reference emulator
    from checkpoints import write_numpy_checkpoint
    from llama_npu.engine import Engine

    real, used = gp.plan_gemm, []

    def resident_first(m, k, n, epilogue="none", **kw):
        p = real(m, k, n, epilogue, **kw)
        if epilogue == "bias" or m == 1:
            return p
        q = gp.GemmPlan(p.tile_m, p.tile_k, p.tile_n, p.herd_m, p.herd_n, p.tile_k_l2, k, epilogue=epilogue,
                        a_resident=True)
        if gp._gemm_fits(q, k):
            used.append((m, k, n, epilogue))
            return q
        return p

    from kernel_builder import registry
    monkeypatch.setattr(gp, "plan_gemm", resident_first)
    registry.kernel_text.cache_clear()          # texts built earlier in this process used the planner's plans
    model = write_numpy_checkpoint(tmp_path / "model", hidden=64, n_heads=2, n_kv_heads=1, ffn=128, vocab=256,
                                   max_position=64, seed=3)

    def run(device):
        eng = Engine.load(str(model), device=device, buckets=(16,), cache_dir=tmp_path / "k", progress=False,
                          warmup=False)
        steps = []
        res = eng.generate([1, 7, 9, 11, 13, 15], max_new_tokens=3, on_logits=lambda s, lg: steps.append(lg.copy()))
        return res.tokens, steps

    try:
        ref_tokens, ref_logits = run("emu")
        int_tokens, int_logits = run("emu-interp")
    finally:
        registry.kernel_text.cache_clear()      # nor may later tests see these

    assert any(e == "swiglu" for *_, e in used) and any(e == "none" for *_, e in used), used
    assert int_tokens == ref_tokens
    for a, b in zip(ref_logits, int_logits):
        np.testing.assert_allclose(b, a, atol=2 * 2.0 ** -8 * float(np.abs(a).max()), rtol=0)
