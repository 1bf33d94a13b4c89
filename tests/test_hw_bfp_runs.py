"""The hardware model rejects the two block-float GEMM modules the real lowering rejected (docs/kernels.md
"gemm_bfp", "Two limits the real lowering showed"; docs/hardware-model.md "Shim runs over 1023 elements"):

1. an i8 W panel row of 9 * tile_k_l2 = 2304 bytes per block row on the shim: air-opt-shim-dma-bds splits the run
   into 3 x 768 (NPU2.air_dma_max_size), the K loop takes the 4th BD dim, the 64-trip column-block loop of the
   launch body is unrolled into 64 tasks per W channel before any wait: "Allocator exhausted available buffer
   descriptor IDs";
2. a memory-tile BD dim of more than NPU2.bd_max_size i8 elements once contiguous dims merge ([rows, 8, 72] ->
   [rows, 576]: "Size may not exceed 1023").

And every module the planner makes today still passes."""
from __future__ import annotations

import dataclasses
import os
import re

import pytest

from kernel_builder.gemm import builder as gemm_builder
from kernel_builder.gemm import plan as gemm_plan
from kernel_builder.hw import analyze_module
from kernel_builder.hw.dma import air_dims
from kernel_builder.hw.facts import NPU2
from kernel_builder.hw.tune import runtime_tiling
from kernel_builder.presets import AirccPreset

SHAPE = (2048, 2048, 8192, "swiglu")   # Llama-3.2-1B's gate/up GEMM, the module that failed


def _forced(monkeypatch, tile_k_l2: int, chunk_k: int | None = None) -> str:
    """The gemm_bfp module at SHAPE with the planner's plan forced to an L2 panel of tile_k_l2 K columns (and the
    L1 W tile's K chunk to chunk_k)."""
    plan = gemm_plan.plan_gemm

    def forced(*a, **kw):
        return dataclasses.replace(plan(*a, **kw), tile_k_l2=tile_k_l2)
    monkeypatch.setattr(gemm_builder.gemm_plan, "plan_gemm", forced)
    if chunk_k is not None:
        monkeypatch.setattr(gemm_builder, "bfp_chunk_k", lambda tile_k: chunk_k)
    m, k, n, epi = SHAPE
    return gemm_builder.build(m, k, n, epi, "bfp16")


def _report(text: str, tiling=None):
    tiling = runtime_tiling(text) if tiling is None else tiling
    return analyze_module(text, preset=AirccPreset(runtime_loop_tiling_sizes=tiling))


def test_air_dims_split_runs_over_the_limit_as_the_pass_does():
    lim = NPU2.air_dma_max_size
    assert lim == 1023
    assert air_dims([(8, 18432), (2304, 1)], lim, 2048 * 18432) == [(8, 18432), (3, 768), (768, 1)]
    assert air_dims([(8, 18432), (576, 1)], lim, 2048 * 18432) == [(8, 18432), (576, 1)]
    assert air_dims([(8, 18432), (1023, 1)], lim) == [(8, 18432), (1023, 1)]
    assert air_dims([(8, 18432), (1024, 1)], lim) == [(8, 18432), (2, 512), (512, 1)]
    # contiguous: one run of any length (the pattern is exempt: linear transfer)
    assert air_dims([(8, 2304), (2304, 1)], lim) == [(8 * 2304, 1)]
    # neighbours merge only within the limit
    assert air_dims([(8, 1 << 20), (4, 512), (512, 1)], lim) == [(8, 1 << 20), (4, 512), (512, 1)]
    assert air_dims([(8, 1 << 20), (2, 288), (288, 1)], lim) == [(8, 1 << 20), (576, 1)]


@pytest.mark.parametrize("tiling", [None, (2, 2), (1, 1)], ids=["tuned", "2x2", "1x1"])
def test_split_w_run_exhausts_the_shim_bds(monkeypatch, tiling):
    text = _forced(monkeypatch, 256)
    assert "[%c8, %c2304] [%c18432, %c1_1]" in text   # the i8 W panel rows of 9 * 256 bytes
    rep = _report(text, tiling)
    assert not rep.ok
    v = rep.violations[0]
    assert (v.tile, v.resource) == ("shim", "BDs") and v.used > NPU2.shim_bds
    msg = v.one_line()
    assert "NPU2.air_dma_max_size = 1023" in msg and "8 x 3 x 768" in msg and "loop %nw" in msg, msg
    # one task per column block of the launch body before any wait (the tool's sequence: 64 per W channel), per
    # launch iteration of a tile of the launch grid
    in_flight = int(re.search(r"keeps (\d+) DMA tasks in flight", msg).group(1))
    assert in_flight % 64 == 0, msg


def test_the_planned_w_run_folds(monkeypatch):
    """The planner's panel (9 * 64 = 576 bytes a row) folds the column-block loop: a few BDs per shim column."""
    text = _forced(monkeypatch, 64)
    rep = _report(text)
    assert rep.ok, rep.first_violation()
    assert rep.usage.shim_bds <= NPU2.shim_bds
    assert gemm_plan.plan_gemm(*SHAPE, w_format="bfp16").tile_k_l2 * 9 <= NPU2.air_dma_max_size


def test_memtile_i8_dim_over_512_after_the_merge_is_rejected(monkeypatch):
    """One K chunk of 64 columns: a W slice is [8 rows, 8 blocks, 72 bytes] of the L2 panel, which merges to
    [8, 576] i8 elements: over the memory-tile BD's NPU2.bd_max_size (the verifier counts elements, not words)."""
    text = _forced(monkeypatch, 256, chunk_k=64)
    rep = _report(text, (2, 2))
    hits = [v for v in rep.violations if (v.tile, v.resource) == ("memtile", "BD wrap/stride")]
    msg = hits[0].one_line() if hits else [v.one_line() for v in rep.violations]
    assert "(576, 1)" in msg and "i8 elements" in msg and "NPU2.bd_max_size = 512" in msg, msg
    ok = _report(_forced(monkeypatch, 256, chunk_k=32), (2, 2))   # 9 * 32 = 288: within it
    assert not [v for v in ok.violations if v.tile == "memtile"]


PHASES = [("llama32-1b", "prefill256"), ("llama32-1b", "prefill2048"), ("llama32-1b", "decode"),
          ("smollm2", "prefill256"), ("smollm2", "prefill2048"), ("llama32-3b", "prefill2048")]


@pytest.mark.parametrize("model,phase", PHASES, ids=[f"{m}-{p}" for m, p in PHASES])
def test_planned_bfp16_modules_pass(model, phase):
    """Every stitched module of the block-float model's phase (the gemm_bfp GEMMs of the prefill layers at the
    planner's plans among them) passes, as the gate sees them (the runtime loop tiling its header records)."""
    from llama_npu.models import llama as shapes
    from llama_npu.models.graph import plan_decls
    from llama_npu.models.llama import LlamaModel
    from multi_launch_builder.stitcher import stitch
    m = LlamaModel({"llama32-1b": shapes.LLAMA32_1B, "smollm2": shapes.SMOLLM2_135M,
                    "llama32-3b": shapes.LLAMA32_3B}[model], "bfp16")
    plan = m.decode(2048) if phase == "decode" else m.prefill(int(phase[len("prefill"):]))
    texts = [(d.name, stitch(d)) for d in plan_decls(plan)]
    assert texts
    if phase != "decode":
        assert any('kind = "gemm_bfp"' in t for _, t in texts)
    for name, text in texts:
        rep = analyze_module(text, name)
        assert rep.ok, rep.first_violation()


LOWER_CASES = [(None, "aiecc", "shim", "buffer descriptor IDs"),        # 1: the split shim run
               (64, "air-to-aie", "memtile", "Size may not exceed 1023")]  # 2: a 576-element i8 memtile dim


@pytest.mark.skipif(not os.environ.get("LLAMA_NPU_AIR_LOWER"),
                    reason="LLAMA_NPU_AIR_LOWER not set (no mlir-air/mlir-aie lowering here)")
@pytest.mark.parametrize("chunk_k,stage,tile,error", LOWER_CASES, ids=["shim-run-split", "memtile-i8-dim"])
def test_real_lowering_rejects_the_forced_module(monkeypatch, tmp_path, chunk_k, stage, tile, error):
    """The tool rejects both forced modules (seconds each), where the model's first violation says."""
    from multi_launch_builder.compile.lowering import lower_with_tool
    text = _forced(monkeypatch, 256, chunk_k)
    src = tmp_path / "gemm_bfp_forced.mlir"
    src.write_text(text)
    flags = AirccPreset(runtime_loop_tiling_sizes=(2, 2)).flags()
    res = lower_with_tool(os.environ["LLAMA_NPU_AIR_LOWER"], src, tmp_path / "out", flags, timeout=1800)
    assert not res.ok and error in res.message, f"{res.stage}: {res.message}"
    first = _report(text, (2, 2)).violations[0]
    assert (first.stage, first.tile) == (stage, tile), first.one_line()


def test_sequence_leaks_follow_the_tools_shim_placement():
    """Llama-3.2-1B's block-float ffn_s2048 (the gate/up GEMM with A and C in block float, then the down GEMM): the
    real lowering (mlir-air efeb41ce4 + mlir-aie ae8ed9d) lowers it, and its runtime sequence leaves, after the
    gate/up launch, 4 shim BDs on columns 0-3 (one split W stream part and one split C write part per column, 2
    launch iterations) and 2 on columns 4-7 (the C writes: one per column, each at its memory tile's column). The
    module's leak accounting uses that placement (segment DMAs at their memory tile's column); the per-launch
    packing two per column in program order would put two C writes on columns 0-3 and reject the module."""
    from llama_npu.models.llama import LLAMA32_1B, LlamaModel
    from multi_launch_builder.stitcher import stitch
    d = next(x for x in LlamaModel(LLAMA32_1B, "bfp16").prefill(2048).decls if x.name.startswith("ffn"))
    rep = analyze_module(stitch(d), d.name)
    assert rep.ok, rep.first_violation()
    act = next(la for la in rep.launches if "act_gemm" in la.name)
    assert act.usage.seq_leak == {0: 4, 1: 4, 2: 4, 3: 4, 4: 2, 5: 2, 6: 2, 7: 2}
    assert act.usage.shim_leak == {0: 6, 1: 6, 2: 6, 3: 6}      # the packed placement's
