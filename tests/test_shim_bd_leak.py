"""Shim BDs that outlive their launch. airrt-to-npu (mlir-air efeb41ce4 AIRRtToNpuPass.cpp) makes one wait per
DMA task, then splits a task whose outermost of 4 BD dims reaches 64 into parts (tileIllegalWrapDim), and pairs
waits with tasks in order per channel: the parts but the first are never freed. aiecc inlines every launch of a
module into one runtime sequence before it assigns the 16 BD IDs per shim tile, so those BDs add up over the
launches. The real lowering of Llama-3.2-1B's two-layer decode token at 32768 positions failed there
('Allocator exhausted available buffer descriptor IDs'; the per-layer module lowered): its decode attention
(4 kv heads side by side, 128 K/V tiles per split) left 6 BDs per layer on each of 4 shim tiles - the same
columns and counts the hardware model now computes. The decode planners take no plan whose query-row read
splits (one kv head per launch iteration there)."""
from __future__ import annotations

import dataclasses
import os

import pytest

from kernel_builder.attention import builder
from kernel_builder.attention import plan as attn_plan
from kernel_builder.attention.plan import AttentionPlan, plan_attention, query_rows_split
from kernel_builder.attention_kv8.plan import plan_attention_kv8
from kernel_builder.hw import analyze_module
from kernel_builder.hw.dma import wrap_split
from kernel_builder.hw.facts import NPU2


def _token_text(kv_rows: int) -> str:
    from llama_npu.models.llama import LLAMA32_1B, LlamaModel
    from llama_npu.token_decode import token_decls
    from multi_launch_builder.compile import generate, stitch_text

    fam = LlamaModel(dataclasses.replace(LLAMA32_1B, n_layers=2))
    (decl,) = token_decls(fam, [kv_rows])
    return stitch_text(generate(decl))


def _attention_pair(plan) -> str:
    """Two decode attention launches of one plan in one module (the second reads the first's output as its query
    rows): the smallest module in which BDs left by one launch meet the next one's."""
    from multi_launch_builder.compile import generate, stitch_text
    from multi_launch_builder.decl import Arg, Launch, ModuleDecl, Role

    text = builder._decode(plan, None)
    q, kv = (1, plan.heads * plan.head_dim), (plan.kv_rows, plan.kv_heads * plan.head_dim)
    args = (Arg("q", q, Role.INPUT), Arg("k", kv, Role.STATIC), Arg("v", kv, Role.STATIC),
            Arg("pos", (1,), Role.INPUT, dtype="i32"), Arg("o1", q, Role.INTERMEDIATE), Arg("o2", q, Role.OUTPUT))
    return stitch_text(generate(ModuleDecl("attn_pair", args, (
        Launch("a", lambda: text, ("q", "k", "v", "pos", "o1")), Launch("b", lambda: text, ("o1", "k", "v", "pos", "o2"))))))


OLD_1B_32K = AttentionPlan(1, 32768, 32, 8, 64, lq=4, lk=64, herd_x=4, herd_y=4)   # the plan before the rule


def test_two_launches_of_the_old_plan_run_out_and_the_new_plan_fits():
    old = analyze_module(_attention_pair(OLD_1B_32K), "attn_pair")
    assert not old.ok and "launch 1" in old.first_violation() and "6 BDs left allocated" in old.first_violation()
    assert analyze_module(_attention_pair(plan_attention(1, 32768, 32, 8, 64)), "attn_pair").ok


@pytest.mark.skipif(not os.environ.get("LLAMA_NPU_AIR_LOWER"), reason="LLAMA_NPU_AIR_LOWER not set (no real lowering)")
@pytest.mark.parametrize("which", ["old", "new"])
def test_the_real_lowering_agrees_on_the_pair(tmp_path, which):
    """The pinned pair: the old plan's pair fails in aie-assign-runtime-sequence-bd-ids (117 s on a loaded 2-core
    machine), the new plan's lowers (59 s)."""
    from multi_launch_builder.compile.lowering import lower_with_tool

    plan = OLD_1B_32K if which == "old" else plan_attention(1, 32768, 32, 8, 64)
    src = tmp_path / "attn_pair.mlir"
    src.write_text(_attention_pair(plan))
    res = lower_with_tool(os.environ["LLAMA_NPU_AIR_LOWER"], src, tmp_path / "out", [], timeout=1800)
    if which == "new":
        assert res.ok, f"{res.stage}: {res.message}"
    else:
        assert not res.ok and "Allocator exhausted available buffer descriptor IDs" in res.message, res.message


def test_wrap_split_cuts_only_a_4_dim_task_whose_outer_dim_reaches_64():
    q_rows = [(4, 64), (4, 256), (64, 1)]                     # a group's 4 query rows of 4 kv heads side by side
    assert wrap_split([(128, 0)] + q_rows, NPU2) == 4         # 128 re-reads -> 4 parts of 32
    assert wrap_split([(64, 0)] + q_rows, NPU2) == 2
    assert wrap_split([(63, 0)] + q_rows, NPU2) == 1
    assert wrap_split([(256, 0), (256, 1)], NPU2) == 1        # contiguous rows: 2 dims, the repeat count holds it
    assert wrap_split([(130, 0)] + q_rows, NPU2) == 5         # largest factor <= 63 of 130: 26 -> 5 parts


def test_a_split_read_leaks_its_extra_parts_per_launch_iteration():
    rep = analyze_module(builder._decode(OLD_1B_32K, None), "attn_kv32768")
    assert rep.ok                                             # on its own it fits (the per-layer module lowered)
    leak = rep.launches[0].usage.shim_leak
    assert sorted(leak.values()) == [6, 6, 6, 6], leak        # 2 launch iterations x (4 parts - 1) per split


def test_the_two_layer_token_that_failed_the_real_lowering_is_rejected(monkeypatch):
    from kernel_builder.registry import kernel_text

    monkeypatch.setattr(attn_plan, "query_rows_split", lambda *a: False)     # the planner before the rule
    kernel_text.cache_clear()
    try:
        rep = analyze_module(_token_text(32768), "token_kv32768")
    finally:
        kernel_text.cache_clear()                            # no kernel text of the old plan stays cached
    v = rep.first_violation()
    assert not rep.ok and "shim BDs 17/16" in v and "6 BDs left allocated by earlier launches" in v, v
    assert "@l1_attn" in v                                    # the second layer's attention, not the first


def test_the_planner_reads_query_rows_without_a_split_and_the_token_fits():
    for kv in (16384, 32768):
        p = plan_attention(1, kv, 32, 8, 64)
        assert not query_rows_split(p.herd_y, p.group, p.kv_tiles) and p.q_tasks == 1
        rep = analyze_module(_token_text(kv), f"token_kv{kv}")
        assert rep.ok, rep.first_violation()
        assert not any(la.usage.shim_leak for la in rep.launches)
    assert plan_attention(1, 8192, 32, 8, 64).herd_y == 4     # 32 tiles: no split, 4 kv heads side by side stay
    k8 = plan_attention_kv8(32768, 32, 8, 64)
    assert not query_rows_split(k8.herd_y, k8.group, k8.kv_tiles)


@pytest.mark.parametrize("kv,heads,kv_heads,hd", [(8192, 24, 8, 128), (32768, 12, 2, 128), (16384, 32, 8, 64)])
def test_no_decode_plan_of_the_families_leaks(kv, heads, kv_heads, hd):
    for p in (plan_attention(1, kv, heads, kv_heads, hd), plan_attention_kv8(kv, heads, kv_heads, hd)):
        assert not query_rows_split(p.herd_y, p.group, p.kv_tiles), p
