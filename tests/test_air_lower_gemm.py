"""The GEMM through the real lowering (mlir-air aircc's npu2 passes + the mlir-aie aiecc passes up to the NPU
instructions), when LLAMA_NPU_AIR_LOWER points to a real-lowering driver (docs/verification.md,
"Real lowering": `air-lower.sh [--whole] [-q] [aircc options] MODULE.mlir OUTDIR`, last line `OK ...` or
`FAIL <stage>/<pass>: ...`); skipped otherwise (no such toolchain in CI). Each case also asks the hardware
model, whose verdict must agree with the lowering's (docs/hardware-model.md "Agreement with the real lowering")."""
from __future__ import annotations

import os

import pytest

from kernel_builder.hw import analyze_module
from multi_launch_builder.compile.lowering import lower_with_tool
from kernel_builder.registry import kernel_text
from kernel_builder.presets import AirccPreset

LOWER = os.environ.get("LLAMA_NPU_AIR_LOWER", "")

pytestmark = pytest.mark.skipif(not LOWER, reason="LLAMA_NPU_AIR_LOWER not set (no mlir-air/mlir-aie lowering here)")

TILED = AirccPreset(runtime_loop_tiling_sizes=(2, 2))

CASES = [
    # (m, k, n), preset, expected last line prefix
    ((64, 576, 576), AirccPreset(), "OK"),          # SmolLM2 Q/O at 64 rows: 1 x 3 launch, lowers untiled
    ((64, 1536, 576), TILED, "OK"),                 # SmolLM2 down: 4 panel steps of 384 (16-BD broadcasts)
    ((256, 2048, 512), TILED, "OK"),                # Llama-3.2-1B K/V
    ((64, 2048, 8192), TILED, "OK"),                # Llama-3.2-1B gate/up at 64 rows: 1 x 16 launch
    ((64, 2048, 8192), AirccPreset(), "FAIL"),      # ... untiled: 16 chained C writes per shim tile in flight
]


@pytest.mark.parametrize("shape,preset,expected", CASES, ids=lambda c: str(c))
def test_gemm_lowers_as_the_hardware_model_says(tmp_path, shape, preset, expected):
    text = kernel_text("gemm", *shape)
    src = tmp_path / ("gemm_%d_%d_%d.mlir" % shape)
    src.write_text(text)
    res = lower_with_tool(LOWER, src, tmp_path / "out", preset.flags(), timeout=1800)
    assert res.ok == (expected == "OK"), f"{res.stage}: {res.message}"
    if expected == "FAIL":
        verdict = f"{res.stage}: {res.message}"
        assert "aie-assign-runtime-sequence-bd-ids" in verdict and "buffer descriptor IDs" in verdict
    rep = analyze_module(text, preset=preset)
    assert rep.ok == (expected == "OK"), rep.first_violation()
    if not rep.ok:
        assert rep.resources() == {"shim BDs"}


# issue 25's GEMM variants through the real lowering (mlir-air efeb41ce4 + mlir-aie ae8ed9d, checked 2026-11-26):
# the in-place epilogue, tile_k 32 at 64x128 with the block-float A scratch and the spread columns (k = 8192
# down projections) lower. gemm_bias and gemm_swiglu: the model and the lowering agree (the test's assertion). A W
# panel filled by two L3 DMAs (the former gemm_swiglu's gate and up rows) fails aie-create-pathfinder-flows on the
# 8x4 herd: AIR's placement puts W panel j beside A panel j and C row panel j (7 S2MM on memory tile j); the
# hardware model places L2 buffers the same way (kernel_builder/hw/memtile_place.py) and rejects it too
# (test_two_load_w_panel_gemm_fails_on_memory_tile_0). gemm_swiglu now reads one weight with gate and up rows
# interleaved by 8 (one W DMA per panel) and lowers at SmolLM2 and Llama-3.2-1B widths.
KIND_CASES = [
    ("gemm", (2048, 8192, 2048), TILED),           # Llama-3.2-1B down: 64x128 tiles, spread columns
    ("gemm", (64, 8192, 2048), TILED),             # ... at 64 rows
    ("gemm", (2048, 2048, 8192), TILED),           # Llama-3.2-1B gate/up: 64x128, tile_k 32
    ("gemm_bias", (256, 1536, 256), TILED),        # Qwen2.5-1.5B K/V projection with its bias
    ("gemm_swiglu", (64, 576, 1536), AirccPreset()),      # SmolLM2 gate/up at 64 rows
    ("gemm_swiglu", (64, 2048, 8192), TILED),             # Llama-3.2-1B gate/up at 64 rows
    ("gemm_swiglu", (2048, 2048, 8192), TILED),           # Llama-3.2-1B gate/up at 2048 rows
]


@pytest.mark.parametrize("kind,shape,preset", KIND_CASES, ids=lambda c: str(c))
def test_gemm_variants_lower_as_the_hardware_model_says(tmp_path, kind, shape, preset):
    text = kernel_text(kind, *shape)
    src = tmp_path / (f"{kind}_%d_%d_%d.mlir" % shape)
    src.write_text(text)
    res = lower_with_tool(LOWER, src, tmp_path / "out", preset.flags(), timeout=1800)
    rep = analyze_module(text, preset=preset)
    assert res.ok == rep.ok, (f"lowering {'OK' if res.ok else f'{res.stage}: {res.message}'}; hardware model "
                              f"{'OK' if rep.ok else rep.first_violation()}")


def test_two_load_w_panel_gemm_fails_on_memory_tile_0(tmp_path):
    # the deliberately broken GEMM of tests/test_hw_memtile_place.py: both reject it on memory tile 0 (column 0)
    from tests.test_hw_memtile_place import _two_load_w_gemm
    text = _two_load_w_gemm(64, 576, 576)
    src = tmp_path / "gemm_w2.mlir"
    src.write_text(text)
    res = lower_with_tool(LOWER, src, tmp_path / "out", [], timeout=1800)
    assert not res.ok and "aie-create-pathfinder-flows" in f"{res.stage}: {res.message}"
    assert "TileID(0, 1)" in res.message
    rep = analyze_module(text)
    assert "memtile S2MM channels 7/6 - memory tile 0 gets" in rep.first_violation()


# the A-resident GEMM (gemm/plan.py A_RESIDENT, on: the 2048-row Q/O and gate/up launches of Llama-3.2-1B): its
# first form (row-major L2 panels, every slice a BD of its own in column-block loops) is refused by both; the
# pre-blocked form with the W stream on @gemm_w lowers in seconds (checked 2026-11-27: 2048x2048x2048 6 s,
# 2048x2048x8192 8 s, gemm_swiglu 2048x2048x8192 6 s)
def test_row_major_resident_gemm_fails_as_the_model_says(tmp_path):
    from tests.test_gemm_resident import _row_major_resident
    text = _row_major_resident(512, 1024, 1024)
    src = tmp_path / "gemm_res_rm.mlir"
    src.write_text(text)
    res = lower_with_tool(LOWER, src, tmp_path / "out", [], timeout=1800)
    assert not res.ok and "more than 48 blocks" in res.message, f"{res.stage}: {res.message}"
    assert any(v.resource == "BD chain" for v in analyze_module(text).violations)


@pytest.mark.parametrize("kind,shape", [("gemm", (2048, 2048, 2048)), ("gemm", (256, 2048, 2048)),
                                        ("gemm_swiglu", (2048, 576, 1536))], ids=str)
def test_resident_gemm_lowers(tmp_path, kind, shape):
    from kernel_builder.hw.tune import preset_for_kernels
    text = kernel_text(kind, *shape)
    assert "@gemm_w" in text           # the planner takes the A-resident plan here
    preset = preset_for_kernels([text])
    src = tmp_path / (f"{kind}_%d_%d_%d.mlir" % shape)
    src.write_text(text)
    res = lower_with_tool(LOWER, src, tmp_path / "out", preset.flags(), timeout=1800)
    rep = analyze_module(text, preset=preset)
    assert res.ok and rep.ok, f"{res.stage}: {res.message}; {rep.first_violation()}"
