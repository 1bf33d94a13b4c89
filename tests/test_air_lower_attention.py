"""The `attention` kernel through the real lowering (mlir-air aircc's npu2 passes + the mlir-aie aiecc passes up to
the NPU instructions), when LLAMA_NPU_AIR_LOWER points to a driver script with the real-lowering driver's
interface (see tests/test_air_lower_gemm.py); skipped otherwise. Each case is lowered with the preset the model
layer records for it (kernel_builder.hw.tune.preset_for_kernels), and the hardware model must pass it with that
preset. The prefill drains its output through L2 with chained writes to o, one per launch iteration and shim
column in flight until a tile of the launch grid ends: it needs the runtime loop tiling the model derives (the
3B prefill untiled / with its rounds untiled exhausted the shim BD IDs; docs/kernels.md "attention")."""
from __future__ import annotations

import os

import pytest

from kernel_builder.hw import analyze_module
from multi_launch_builder.compile.lowering import lower_with_tool
from kernel_builder.hw.tune import preset_for_kernels
from kernel_builder.registry import kernel_text
from kernel_builder.presets import AirccPreset

LOWER = os.environ.get("LLAMA_NPU_AIR_LOWER", "")

pytestmark = pytest.mark.skipif(not LOWER, reason="LLAMA_NPU_AIR_LOWER not set (no mlir-air/mlir-aie lowering here)")

CASES = [
    # (rows, kv_rows, heads, kv_heads, head_dim)
    (64, 64, 9, 3, 64),          # SmolLM2 prefill chunk at 64 rows (GQA group 3: a pad Q item)
    (1, 256, 9, 3, 64),          # SmolLM2 decode over a 256-position window
    (2048, 2048, 32, 8, 64),     # Llama-3.2-1B prefill 2048
    (1, 2048, 32, 8, 64),        # Llama-3.2-1B decode over 2048 positions
    (2048, 2048, 24, 8, 128),    # Llama-3.2-3B prefill 2048 (head_dim 128)
    (2048, 8192, 32, 8, 64),     # Llama-3.2-1B chunk of 2048 over an 8192-position window
    (256, 256, 32, 8, 64),       # Llama-3.2-1B prefill 256 (2 Q tiles per item, lq = lk = 32)
    (1, 8192, 24, 8, 128),       # Llama-3.2-3B decode: 4 splits x 4 kv heads, 8 L2 buffers
]


def _lower(tmp_path, text: str, preset: AirccPreset, tag: str):
    src = tmp_path / f"attention_{tag}.mlir"
    src.write_text(text)
    return lower_with_tool(LOWER, src, tmp_path / f"out_{tag}", preset.flags(), timeout=1800)


@pytest.mark.parametrize("shape", CASES, ids=lambda c: "x".join(map(str, c)))
def test_attention_lowers_and_the_hardware_model_passes_it(tmp_path, shape):
    text = kernel_text("attention", *shape)
    preset = preset_for_kernels([text])
    res = _lower(tmp_path, text, preset, "preset")
    assert res.ok, f"{res.stage}: {res.message}"
    rep = analyze_module(text, preset=preset)
    assert rep.ok, rep.first_violation()
    if preset.runtime_loop_tiling_sizes:   # the model asked for the tiling: untiled it counts a BD overflow
        untiled = analyze_module(text, preset=AirccPreset(stack_size=preset.stack_size))
        assert any(v.tile == "shim" and v.resource == "BDs" for v in untiled.violations)
