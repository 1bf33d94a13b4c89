"""aircc presets from the hardware model's numbers (kernel_builder.hw.tune): the stack a module's kernels need,
ping-pong omission only where L1 overflows because of ping-pong copies, and the presets the model layer gives
every declared module (the cheap per-kernel path agrees with a full analysis of the stitched module)."""
from __future__ import annotations

import pytest

from kernel_builder.hw import analyze as analyze_mod
from kernel_builder.hw import analyze_module
from kernel_builder.hw.tune import derive_preset, preset_for_kernels, stack_need
from kernel_builder.registry import kernel_text
from kernel_builder.presets import AirccPreset
from multi_launch_builder.stitcher import stitch
from llama_npu.models.llama import LLAMA32_1B, SMOLLM2_135M, LlamaModel
from tests.hw_texts import herd_module, pingpong_body


def test_stack_need_from_external_kernels_and_core_division():
    assert stack_need([kernel_text("add", 64, 576)]) == 1024
    assert stack_need([kernel_text("gemv", 576, 576), kernel_text("rope", 64, 9, 64)]) == 1024
    assert stack_need([kernel_text("rmsnorm", 64, 576, 1e-5)]) == 1152      # scalar invsqrt (soft-float)
    assert stack_need([kernel_text("add", 64, 576), kernel_text("rmsnorm", 1, 576, 1e-5)]) == 1152
    divf = herd_module("""
          %a = arith.constant 1.0 : f32
          %b = arith.divf %a, %a : f32""", "memref<64xbf16>", sizes=(1, 1))
    assert stack_need([divf]) == 1152
    assert preset_for_kernels([kernel_text("rmsnorm", 64, 576, 1e-5)]) == AirccPreset(stack_size=1280)
    assert preset_for_kernels([kernel_text("add", 64, 576)]) == AirccPreset()
    keep = AirccPreset(omit_while_true_loop=True, stack_size=2048)
    assert preset_for_kernels([kernel_text("rmsnorm", 64, 576, 1e-5)], keep) == keep   # never lowered


def test_derive_preset_omits_pingpong_only_when_its_copies_overflow_l1():
    over = herd_module(pingpong_body("dma"), "memref<262144xbf16>", sizes=(4, 1))
    assert analyze_module(over).resources() == {"core L1 bytes"}
    p = derive_preset(over)
    assert p == AirccPreset(omit_pingpong="L1") and analyze_module(over, preset=p).ok
    first_call = herd_module(pingpong_body("call"), "memref<262144xbf16>", sizes=(4, 1))
    # the pinned mlir-air labels every allocating loop (a buffer first written by a call too); HEAD's
    # candidate rule would leave this loop alone
    want = AirccPreset() if analyze_mod.PINGPONG_RULE == "candidates" else AirccPreset(omit_pingpong="L1")
    assert derive_preset(first_call) == want


def test_derive_preset_raises_the_stack_and_the_module_then_fits():
    text = kernel_text("rmsnorm", 64, 2048, 1e-5)
    assert analyze_module(text).resources() == {"core stack bytes"}
    p = derive_preset(text)
    assert p.stack_size == 1280 and analyze_module(text, preset=p).ok


@pytest.mark.parametrize("shapes", [SMOLLM2_135M, LLAMA32_1B], ids=["smollm2", "llama32-1b"])
def test_model_presets_equal_a_full_analysis_of_each_decode_module(shapes):
    m = LlamaModel(shapes)
    for decl in m.decode().decls + m.head().decls:
        text = stitch(decl)
        assert decl.preset is None   # the model only declares; the build derives the preset
        assert decl.aircc_preset() == derive_preset(text, decl.name) == AirccPreset(stack_size=1280), decl.name
        rep = analyze_module(text)   # reads the preset recorded in the stitched header
        assert rep.ok, rep.first_violation()
