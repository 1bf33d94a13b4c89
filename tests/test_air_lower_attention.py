"""The `attention` kernel through the real lowering (mlir-air aircc's npu2 passes + the mlir-aie aiecc passes up to
the NPU instructions), when LLAMA_NPU_AIR_LOWER points to a driver script with `/work/tools/air-lower.sh`'s
interface (see tests/test_air_lower_gemm.py); skipped otherwise. Each case is lowered with the preset the model
layer records for it (kernel_builder.hw.tune.preset_for_kernels) and untiled, and the hardware model must pass it
with its preset. Untiled, the prefill modules lower too while the model counts their per-iteration Q puts as in
flight together (docs/kernels.md "attention", real lowering)."""
from __future__ import annotations

import os
import subprocess

import pytest

from kernel_builder.hw import analyze_module
from kernel_builder.hw.tune import preset_for_kernels
from kernel_builder.kernels import kernel_text
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
]


def _lower(tmp_path, text: str, preset: AirccPreset, tag: str) -> str:
    src = tmp_path / f"attention_{tag}.mlir"
    src.write_text(text)
    res = subprocess.run([LOWER, "--whole", "-q", *preset.flags(), str(src), str(tmp_path / f"out_{tag}")],
                         capture_output=True, text=True, timeout=1800)
    return (res.stdout.strip().splitlines() or [""])[-1]


@pytest.mark.parametrize("shape", CASES, ids=lambda c: "x".join(map(str, c)))
def test_attention_lowers_and_the_hardware_model_passes_it(tmp_path, shape):
    text = kernel_text("attention", *shape)
    preset = preset_for_kernels([text])
    last = _lower(tmp_path, text, preset, "preset")
    assert last.startswith("OK"), last
    rep = analyze_module(text, preset=preset)
    assert rep.ok, rep.first_violation()
    if preset != AirccPreset():
        assert _lower(tmp_path, text, AirccPreset(), "untiled").startswith("OK")
