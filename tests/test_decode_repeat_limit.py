"""The shim DMA task repeat count (aiex.npu.push_queue: at most 255). The decode attention item carries the GQA
group's query rows again with every K/V tile; their DMA from DDR is one shim task whose repeat count is the tiles
per split less one (mlir-air airrt-to-npu). The real lowering (mlir-air efeb41ce4 + mlir-aie ae8ed9d) refused
Gemma-3-1B's `layer_kv32768` (head_dim 256: 4 splits of 8192 keys in 16-row tiles, 512 tiles) in
aie-dma-tasks-to-npu with "'aiex.npu.push_queue' op Repeat count exceeds the [0:255] range" and lowered
`layer_kv16384` (256 tiles). The hardware model predicts both; the planner keeps decode at <= 256 tiles per
split; the default context steps down to one whose decode tiles, and a --context past it is one line."""
from __future__ import annotations

import json

import pytest

from kernel_builder.attention import builder
from kernel_builder.attention.plan import DECODE_MAX_TILES, AttentionPlan, plan_attention
from kernel_builder.hw import analyze_module
from kernel_builder.hw.dma import task_runs

GEMMA = dict(heads=4, kv_heads=1, head_dim=256)


def _decode_text(kv_rows: int) -> str:
    """Gemma-3-1B's decode attention with the tiling the planner gave before the limit (4 splits, 16-row tiles)."""
    p = AttentionPlan(1, kv_rows, GEMMA["heads"], GEMMA["kv_heads"], GEMMA["head_dim"], lq=4, lk=16, herd_x=4,
                      herd_y=1)
    return builder._decode(p, None)


def test_task_runs_counts_the_highest_dim_and_re_reads():
    assert task_runs([(1024, 1)]) == 1
    assert task_runs([(512, 0), (1024, 1)]) == 512                      # a loop-invariant row read 512 times
    assert task_runs([(2, 0), (256, 0), (1024, 1)]) == 512              # two such loops multiply
    assert task_runs([(8, 4096), (4, 0), (16, 64), (32, 1)]) == 32      # the 4th dim is the repeat, times re-reads
    assert task_runs([(512, 4096), (16, 64), (32, 1)]) == 1             # a walking loop is a BD dim, no repeat


@pytest.mark.parametrize("kv_rows,ok", [(16384, True), (32768, False)])
def test_hardware_model_predicts_the_query_rows_repeat_count(kv_rows, ok):
    rep = analyze_module(_decode_text(kv_rows), f"attn_kv{kv_rows}")
    assert rep.ok is ok, rep.first_violation()
    if not ok:
        v = rep.first_violation()
        assert "DMA task repeat count 511/255" in v and "Repeat count exceeds the [0:255] range" in v, v


def test_planner_keeps_decode_within_the_repeat_count():
    assert plan_attention(1, 16384, *GEMMA.values()).kv_tiles == DECODE_MAX_TILES == 256
    with pytest.raises(ValueError, match="256 K/V tiles per split"):
        plan_attention(1, 32768, *GEMMA.values())
    assert plan_attention(1, 32768, 32, 8, 128).kv_tiles <= DECODE_MAX_TILES   # Llama-style widths still tile


def test_context_steps_down_to_one_whose_decode_tiles(tmp_path):
    from llama_npu.config import load_config
    from llama_npu.errors import ContextError
    from llama_npu.memory import choose_context

    cfg = {"architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text", "hidden_size": 256,
           "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 256, "intermediate_size": 512,
           "num_hidden_layers": 2, "vocab_size": 512, "max_position_embeddings": 32768, "rms_norm_eps": 1e-6,
           "hidden_activation": "gelu_pytorch_tanh", "sliding_window": 512, "query_pre_attn_scalar": 256,
           "layer_types": ["sliding_attention", "full_attention"], "rope_theta": 1e6, "rope_local_base_freq": 1e4,
           "tie_word_embeddings": True}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    c = load_config(tmp_path)
    assert choose_context(c, (64, 2048)) == 16384
    assert choose_context(c, (64,), 16384) == 16384
    with pytest.raises(ContextError, match=r"--context 32768: .* pass --context 16384"):
        choose_context(c, (64,), 32768)
    cfg.update(head_dim=64, max_position_embeddings=32768)      # head_dim 64: 64-row tiles, 32768 tiles
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    assert choose_context(load_config(tmp_path), (64,)) == 32768


def test_strided_query_rows_past_63_tiles_are_one_task_per_part():
    """Phi-4-mini / Llama-3.2-3B widths (24 heads, 8 kv heads, head_dim 128) at 32768 positions: with 4 kv heads
    side by side the query rows are a 3-dim access, so the folded tiles are the 4th BD dim, which airrt-to-npu
    tiles below 64: 256 tiles -> 8 tasks of 32 per launch iteration, 2 iterations: 16 BDs + the K stream on one
    shim tile. The real lowering refused that plan ('Allocator exhausted available buffer descriptor IDs') and
    lowered the 16384 one (4 tasks per iteration); the planner now takes one kv head per launch iteration there
    (contiguous rows: one task), which lowered (70 s, standalone)."""
    old = AttentionPlan(1, 32768, 24, 8, 128, lq=3, lk=32, herd_x=4, herd_y=4)
    assert old.q_tasks == 16
    rep = analyze_module(builder._decode(old, None), "attn_kv32768")
    assert not rep.ok and "shim BDs" in rep.first_violation() and "16 DMA tasks" in rep.first_violation()
    new = plan_attention(1, 32768, 24, 8, 128)
    assert (new.herd_y, new.q_tasks) == (1, 1) and analyze_module(builder._decode(new, None), "attn").ok
    # 16384 (128 tiles) too: any split leaves BDs allocated to the end of the runtime sequence
    assert plan_attention(1, 16384, 24, 8, 128).q_tasks == 1           # (tests/test_shim_bd_leak.py)
