"""benchmarks/prefill_targets.py (printed by `make bench`): the 1B prefill against issue 25's targets and the per-GEMM
rates beside the kernel registry's measurement of the same shape."""
from __future__ import annotations

from benchmarks import prefill_targets as pt


def test_prints_scenarios_and_gemm_rates(capsys):
    out = pt.bench_prefill_targets(0.001, tokens=(64,))
    assert out[64]["likely"] < out[64]["pessimistic"]      # the pessimistic scenario is slower
    text = capsys.readouterr().out
    assert "64 tokens:" in text and "pessimistic" in text
    # every prefill GEMM launch of the 64-row chunk gets a line with its shape and TFLOPS
    for name in ("q_gemm", "k_gemm", "v_new_gemm", "proj_gemm", "act_gemm", "down_gemm"):   # act: gate+up+SwiGLU
        assert name in text, name
    assert "gemm_swiglu" in text
    assert "64x2048x8192" in text and "TFLOPS" in text
    assert "best measured block-float GEMM: 31.3 TFLOPS on Strix" in text   # facts.py, beside the rates


def test_registry_table_and_attribute_reader():
    assert pt.REGISTRY_BF16_OUT_GFLOPS[(2048, 8192, 2048)] == 8898
    text = 'x {llama_npu.kernel = {kind = "gemm", m = 64, k = 2048, n = 512}} y ' \
           '{llama_npu.kernel = {kind = "rmsnorm", rows = 64, dim = 2048, eps = 9.999999740e-06 : f32}}'
    assert pt._kernel_attrs(text) == [("gemm", {"m": 64, "k": 2048, "n": 512}), ("rmsnorm", {"rows": 64, "dim": 2048})]
