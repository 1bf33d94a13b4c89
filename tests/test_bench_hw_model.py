"""`make bench`'s hardware-model section (benchmarks/hw_model.py): the decode token is the fused layer module per
layer + the LM head at each KV window, printed beside the bandwidth floor; the floor's weight bytes are the
model's real parameter count."""
from __future__ import annotations

import re

import pytest

from benchmarks.hw_model import DECODE_WINDOWS, bench_hw_model, weight_bytes_per_token
from llama_npu.models.llama import LLAMA32_1B, SMOLLM2_135M, LlamaModel


def test_weight_bytes_are_the_published_parameter_counts():
    # Llama-3.2-1B: 1,235,814,400 parameters (tied embeddings, read once per token as the LM head);
    # SmolLM2-135M: 134,515,008
    assert weight_bytes_per_token(LlamaModel(LLAMA32_1B)) == 2 * 1_235_814_400
    assert weight_bytes_per_token(LlamaModel(SMOLLM2_135M)) == 2 * 134_515_008


def test_decode_line_sums_the_fused_modules(capsys):
    from kernel_builder.hw import analyze_module
    from multi_launch_builder.stitcher import stitch
    bench_hw_model(scenarios=False)
    out = capsys.readouterr().out
    line = next(l for l in out.splitlines() if "modeled decode per token" in l)
    assert "16 x layer_kv<window> + lm_head, 17 dispatches" in line
    m = LlamaModel(LLAMA32_1B)
    head = analyze_module(stitch(m.head().decls[0])).modeled_s
    for w in DECODE_WINDOWS:
        (decl,) = m.decode(w).decls
        want = 16 * analyze_module(stitch(decl)).modeled_s + head
        got = float(re.search(rf"window {w}: ([\d.]+) ms", line).group(1))
        assert abs(got - want * 1e3) < 0.051, (w, got, want)
    assert re.search(r"bandwidth floor: 2\.47 GB of weights per token .* / 60 GB/s = 41\.2 ms", out)
    assert "fallback, host attention" in out


def test_modeled_chunks_cost_attention_at_the_chunks_position():
    """The bench's per-chunk model: a chunk late in a window costs more than the same chunk at position 0 (its
    causal attention covers more keys), and chunks add up."""
    from benchmarks.hw_model import modeled_chunks
    from llama_npu.models.llama import SMOLLM2_135M, LlamaModel

    m = LlamaModel(SMOLLM2_135M)
    windows = m.kv_windows(2048)
    first = modeled_chunks(m, [(0, 64)], windows)
    late = modeled_chunks(m, [(1984, 64)], windows)
    assert 0 < first < late
    assert modeled_chunks(m, [(0, 64), (1984, 64)], windows) == pytest.approx(first + late)
