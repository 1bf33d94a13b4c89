"""The NPU2 hardware model on every module today's builders generate: SmolLM2-135M, Llama-3.2-1B and
Llama-3.2-3B at the default buckets (docs/hardware-model.md).

EXPECTED pins which modules violate what. The kernel issue that reworks the builders (staged GEMM output,
flash attention through memory tiles, tile_m >= 2 GEMVs, affine elementwise offsets, loads inside loops,
a larger stack where soft-float division remains) flips it: set every family to `{}` (done for the decode
modules: GEMV, RMSNorm, add, SwiGLU, RoPE).
"""
from __future__ import annotations

import functools

import pytest

from kernel_builder import planner
from kernel_builder.hw import analyze_module
from kernel_builder.stitching import stitch
from kernel_builder.kernels import kernel_text
from llama_npu.models import llama as shapes
from llama_npu.models.llama import LlamaModel

MODELS = {"smollm2-135m": shapes.SMOLLM2_135M, "llama32-1b": shapes.LLAMA32_1B, "llama32-3b": shapes.LLAMA32_3B}
BUCKETS = (64, 256, 1024, 2048)  # llama_npu.engine.DEFAULT_BUCKETS

ALWAYS = lambda sh, seq: True  # noqa: E731


def _attn_tiles(sh, seq) -> int:
    p = planner.plan_flash_attn(seq, sh.n_heads, sh.n_kv_heads, sh.head_dim)
    return p.herd_q * p.herd_h


# family -> {"<tile> <resource>": where it applies (shapes, seq)}; {} = the family fits the chip
EXPECTED = {
    "qkv": {
        "shim S2MM channels": ALWAYS,       # Q/K/V GEMM: every one of 32 cores stores its C tile to L3
    },
    "attn": {
        "shim MM2S channels": ALWAYS,       # Q, K, V straight from L3 to every core
        "shim S2MM channels": lambda sh, seq: _attn_tiles(sh, seq) > 16,   # O from every core
        "core S2MM channels": ALWAYS,       # three inbound streams per core
        "core DMA placement": ALWAYS,       # Q loaded outside the K loop
    },
    "ffn": {
        "shim S2MM channels": ALWAYS,
    },
    # GEMV, RMSNorm, add, SwiGLU, RoPE fit (x / the RMSNorm weight re-sent from L2 inside the loop, outputs
    # stored once, affine 1-D offsets); the presets carry the stack RMSNorm and attention need
    "qkv_dec": {},
    "ffn_dec": {},
    "lm_head": {},
}


def _family(name: str) -> tuple[str, int]:
    """qkv_s64 -> (qkv, 64); qkv_dec -> (qkv_dec, 1); lm_head -> (lm_head, 1)."""
    head, _, tail = name.rpartition("_s")
    return (head, int(tail)) if tail.isdigit() else (name, 1)


@functools.lru_cache(maxsize=None)
def _texts(model: str) -> tuple[tuple[str, str], ...]:
    return tuple((d.name, stitch(d)) for d in LlamaModel(MODELS[model]).modules(BUCKETS))


@functools.lru_cache(maxsize=None)
def _reports(model: str):
    return tuple(analyze_module(text, name) for name, text in _texts(model))


@pytest.mark.parametrize("model", list(MODELS))
def test_every_module_of_every_model_matches_the_pinned_verdicts(model):
    sh = MODELS[model]
    reps = _reports(model)
    assert len(reps) == 3 * len(BUCKETS) + 3   # prefill per bucket, qkv_dec + ffn_dec, lm_head
    for rep in reps:
        fam, seq = _family(rep.name)
        expected = {res for res, applies in EXPECTED[fam].items() if applies(sh, seq)}
        assert rep.resources() == expected, f"{model} {rep.name}: {sorted(rep.resources())} != {sorted(expected)}"
        assert rep.ok == (not expected)
        if not rep.ok:
            line = rep.first_violation()
            assert line.startswith(f"{rep.name}: launch ") and "\n" not in line
        # every module gets a finite time, and launch-level figures add up
        assert 0 < rep.modeled_ms < float("inf")
        assert rep.usage.herd_tiles <= 32


def test_prefill_gemm_and_flash_attention_are_rejected_with_the_reason_and_k8192_gemv_fits():
    gemm = analyze_module(kernel_text("gemm", 2048, 2048, 8192))
    assert "shim S2MM channels 32/16" in gemm.first_violation() and "store" in gemm.first_violation()
    fa = analyze_module(kernel_text("flash_attn", 2048, 32, 8, 64))
    assert {"shim MM2S channels", "shim S2MM channels", "core S2MM channels"} <= fa.resources()
    gemv = analyze_module(kernel_text("gemv", 2048, 8192))   # K chunks: 16-row tiles, one 512-byte store per tile
    assert gemv.ok, gemv.first_violation()


def test_known_lowering_outcomes_at_smollm2_shapes():
    """What the real lowering (air-to-aie + aiecc passes, /work/tools/air-lower.sh) did with the single-kernel
    modules at 64 rows: add, rope, swiglu, rmsnorm and gemv lower (rmsnorm and gemv since the rework: the
    weight / x re-sent from L2 inside the loop; before, both failed in air-dma-to-channel "operand does not
    dominate this use", as flash_attn still does); gemm fails on its per-core C stores (shim channels)."""
    sh, rows = shapes.SMOLLM2_135M, 64
    texts = {"add": kernel_text("add", rows, sh.hidden), "rope": kernel_text("rope", rows, sh.n_heads, sh.head_dim),
             "swiglu": kernel_text("swiglu", rows, sh.ffn), "gemm": kernel_text("gemm", rows, sh.hidden, sh.hidden),
             "gemv": kernel_text("gemv", sh.hidden, sh.hidden), "rmsnorm": kernel_text("rmsnorm", rows, sh.hidden, 1e-5),
             "flash_attn": kernel_text("flash_attn", rows, sh.n_heads, sh.n_kv_heads, sh.head_dim)}
    reps = {k: analyze_module(t, k) for k, t in texts.items()}
    resource = {k: {f"{v.tile} {v.resource}" for v in r.violations if v.kind == "resource"} for k, r in reps.items()}
    for k in ("add", "rope", "swiglu", "gemv", "rmsnorm"):
        assert resource[k] == set(), k
    assert resource["gemm"] == {"shim S2MM channels"}
    assert reps["flash_attn"].violations[0].resource == "DMA placement"
    assert reps["flash_attn"].violations[0].stage == "air-dma-to-channel"
    # the one rule left for rmsnorm alone: its stack (the module presets raise it, LlamaModel.presets)
    assert {v.resource for v in reps["rmsnorm"].violations} == {"stack bytes"}


def test_modeled_time_reflects_scalar_matmul():
    """Today's GEMM leaves linalg.matmul to aircc's convert-linalg-to-loops: all its MACs are scalar and the
    modeled time is orders of magnitude above a vectorised kernel of the same shape."""
    rep = analyze_module(kernel_text("gemm", 2048, 2048, 2048))
    assert rep.scalar_share == 1.0
    from kernel_builder.hw import cost
    works = [la.work for la in rep.launches]
    assert cost.module_seconds(works) > 50 * cost.module_seconds(works, vectorized_matmul=True)
    gemv = analyze_module(kernel_text("gemv", 2048, 2048))
    assert gemv.scalar_share == 0.0
