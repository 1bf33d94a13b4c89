"""plan_memory against what the ModuleExecutor really allocates on the null device for a tiny model, and the
sharing rules it follows (statics once per family and layer, activations once per module)."""
from __future__ import annotations

import pytest

from checkpoints import write_numpy_checkpoint
from llama_npu.config import load_config
from llama_npu.engine import Engine
from llama_npu.memory import MemoryPlan, plan_memory
from llama_npu.models.llama import LLAMA32_1B, ModelShapes

TINY = ModelShapes(hidden=256, n_heads=4, n_kv_heads=2, head_dim=64, ffn=512, vocab=512, n_layers=2, rms_eps=1e-5)


@pytest.fixture(scope="module")
def tiny_two_layers(tmp_path_factory):
    return write_numpy_checkpoint(tmp_path_factory.mktemp("mem") / "model", n_layers=2, seed=3)


def test_plan_matches_the_kernel_cache_on_the_null_device(tiny_two_layers, kernel_cache_dir):
    buckets = (16, 64)
    eng = Engine.load(str(tiny_two_layers), device="null", buckets=buckets, cache_dir=kernel_cache_dir,
                      progress=False)
    # warmup ran the 16-row bucket; a 20-token prompt runs the 64-row one, so every module has its buffers
    eng.prefill(list(range(3, 23)))
    eng.decode_step(5)
    report = eng.cache.memory_report()
    cfg = load_config(tiny_two_layers)
    plan = plan_memory(cfg, buckets, context=eng.kv_capacity)
    assert report["cache_allocated_bytes"] == report["device_allocated_bytes"] == plan.total
    assert report["state_bytes"] == plan.kv_cache_bytes + plan.embed_bytes   # + the token modules' embedding rows
    assert plan.total == plan.weights_bytes + plan.kv_cache_bytes + plan.activation_bytes


def test_weights_are_shared_across_buckets_and_counted_per_layer():
    one = plan_memory(TINY, (16,), 128)
    two = plan_memory(TINY, (16, 64), 128)
    assert two.weights_bytes == one.weights_bytes            # a layer's weights serve every bucket
    assert two.activation_bytes > one.activation_bytes
    deeper = plan_memory(ModelShapes(**{**TINY.__dict__, "n_layers": 4}), (16,), 128)
    # LM head + final norm + the one-module decode token's empty candidates (one window): once, whatever the depth
    lm_head = (TINY.vocab + 1) * TINY.hidden * 2 + 8
    assert deeper.weights_bytes - lm_head == 2 * (one.weights_bytes - lm_head)
    # the per-layer modules: one activation set per module, whatever the depth; the one-module decode token holds
    # every layer's intermediates (host decode attention builds no token module)
    d4 = ModelShapes(**{**TINY.__dict__, "n_layers": 4})
    host = [plan_memory(s, (16,), 128, "host").activation_bytes for s in (d4, TINY)]
    assert host[0] == host[1]
    assert deeper.activation_bytes > one.activation_bytes


def test_kv_cache_formula_and_llama_1b_figure():
    p = plan_memory(LLAMA32_1B, (64,), 2048)
    assert p.kv_cache_bytes == 2 * 16 * 8 * 2048 * 64 * 2 + 2048 * 64 * 2 == (64 << 20) + (256 << 10)
    # ONE [out, in] copy of every layer's weights (prefill GEMMs and decode GEMVs share it) + the RMSNorm
    # weights, plus the LM head partitions (8 x 16384 rows: the VOCAB state, which the one-module decode token
    # also reads its embedding row from) and the final norm, and the token modules' empty candidates (4 windows)
    s = LLAMA32_1B
    proj = s.q_dim * s.hidden + 2 * s.kv_dim * s.hidden + s.hidden * s.q_dim + 3 * s.ffn * s.hidden
    layer = 2 * (proj + 2 * s.hidden)
    assert p.weights_bytes == s.n_layers * layer + 2 * (8 * 16384 * s.hidden + s.hidden) + 4 * 8 == 2483163168
    assert p.embed_bytes == 2 * 8 * 16384 * s.hidden
    assert 2.3 < (p.weights_bytes + p.activation_bytes) / 2**30 < 2.4   # was 4.2 GiB with the transposed copies
    assert isinstance(p, MemoryPlan)


def test_untied_8b_q4_weights_and_kv_cache_at_8k_fit_6_gib():
    """Llama-3.1-8B (untied) with 4-bit weights: the one-dispatch decode's embedding rows are q4 rows (group 32,
    mins) beside the q4 LM head, so weights + the KV cache at 8k stay within 6 GiB (issue 26); with bf16 rows
    they would not."""
    from kernel_builder.gemv_q4.format import Q4Layout
    from llama_npu.models.llama import LLAMA31_8B
    s = LLAMA31_8B
    tied = plan_memory(s, (64,), 8192, weights="q4", tied=True)
    untied = plan_memory(s, (64,), 8192, weights="q4", tied=False)
    assert untied.embed_bytes - tied.embed_bytes == s.vocab * Q4Layout(s.hidden, 32, True).row_bytes
    assert (untied.weights_bytes + untied.kv_cache_bytes) / 2**30 <= 6.0
    bf16_rows = untied.weights_bytes + s.vocab * s.hidden * 2 - s.vocab * Q4Layout(s.hidden, 32, True).row_bytes
    assert (bf16_rows + untied.kv_cache_bytes) / 2**30 > 6.0


def test_config_buckets_are_filtered_to_the_context(tiny_model_dir):
    cfg = load_config(tiny_model_dir)          # context 256
    assert plan_memory(cfg, (64, 1024), 256) == plan_memory(cfg, (64,), 256)


@pytest.mark.parametrize("context", [0, -1, 1.5, True])
def test_bad_context_is_rejected(context):
    with pytest.raises(ValueError, match="context"):
        plan_memory(TINY, (16,), context)
