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
from llama_npu.models.graph import HEAD_PLAN, Op, Phase, Stage, State, Weight, decode_plan, prefill_plan
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


def test_ops_and_phases_are_typed():
    """Operands are activations (tensor names), Weight or State; every plan's key is its own Phase. The old
    "w:"/"s:" spelling is typed once when an op is declared (so a declaration may still use it)."""
    m = LlamaModel(SMOLLM2_135M)
    kinds = {type(t) for op in m.graph.ops for t in op.ins}
    assert kinds == {str, Weight, State}
    assert not any(isinstance(t, str) and t[1:2] == ":" for op in m.graph.ops for t in op.ins)
    assert Op("linear", ("h", "w:wq"), "q", 8) == Op("linear", ("h", Weight("wq")), "q", 8)
    assert Op("rope", ("q", "s:rope"), "q_r", 8).ins == ("q", State("rope"))
    plans = m.plans((16, 64), context=512, decode_attention="npu")
    assert {k.stage for k in plans} == set(Stage)
    assert all(p.phase == k for k, p in plans.items())
    assert prefill_plan(16, 256) in plans and decode_plan(512) in plans and HEAD_PLAN in plans
    assert decode_plan(None) in m.plans((16,), decode_attention="host")
    assert Phase("prefill", 16, 16) == prefill_plan(16, 16)      # a stage by its name is the Stage
    with pytest.raises(ValueError):
        Phase("chunk", 16, 16)
