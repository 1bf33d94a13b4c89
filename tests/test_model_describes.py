"""The model description only describes: declaring every phase's modules (the plans behind the memory check,
`llama-npu doctor` and Engine.load) generates no kernel text and runs no hardware analysis; the build derives
each module's aircc preset from its kernels (ModuleDecl.aircc_preset) and records it in the stitched header,
which keys the artifact."""
from __future__ import annotations

import dataclasses

import pytest

import kernel_builder.hw.tune as tune
import kernel_builder.registry as registry
from kernel_builder.presets import AirccPreset, preset_of_text
from llama_npu.memory import plan_memory
from llama_npu.models.llama import LLAMA32_1B, SMOLLM2_135M, LlamaModel
from multi_launch_builder.compile.driver import generate, stitch_text


def test_the_memory_check_at_32k_generates_no_mlir(monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("a kernel was generated or analysed while declaring modules")

    monkeypatch.setattr(registry, "kernel_text", refuse)
    monkeypatch.setattr(tune, "preset_for_kernels", refuse)
    plan = plan_memory(LLAMA32_1B, (64, 256, 1024, 2048), 32768)
    assert plan.total > plan.weights_bytes > 0
    decls = [d for p in LlamaModel(LLAMA32_1B).plans((64, 2048), context=32768).values() for d in p.decls]
    assert decls and all(d.preset is None for d in decls)


@pytest.mark.parametrize("name,preset", [("layer_kv256", AirccPreset(stack_size=1280)),
                                         ("lm_head", AirccPreset(stack_size=1280))])
def test_the_build_derives_the_preset_and_records_it(name, preset):
    decl = next(d for d in LlamaModel(SMOLLM2_135M).decode(256).decls + LlamaModel(SMOLLM2_135M).head().decls
                if d.name == name)
    gen = generate(decl)
    assert gen.preset == decl.aircc_preset() == preset
    assert preset_of_text(stitch_text(gen)) == preset


def test_a_declared_preset_wins():
    decl = LlamaModel(SMOLLM2_135M).head().decls[0]
    mine = AirccPreset(stack_size=2048, runtime_loop_tiling_sizes=(1, 1))
    assert preset_of_text(stitch_text(generate(dataclasses.replace(decl, preset=mine)))) == mine
