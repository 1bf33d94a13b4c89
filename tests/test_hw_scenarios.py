"""The cost model's scenarios and parameter sources (kernel_builder/hw/scenarios.py, cost.py), the out-of-sample
calibration (kernel_builder/hw/calibration.py), the emulated-mmul charge read from a kernel's compile defines,
and `make bench`'s like-for-like section (benchmarks/hw_scenarios.py)."""
from __future__ import annotations

import dataclasses
import math
import re
from pathlib import Path

import pytest

from benchmarks.hw_calibration import gemm, reference_points, registry_points
from kernel_builder import external_costs as ec
from kernel_builder.hw import analyze_module, cost
from kernel_builder.hw.calibration import both_ways, validate
from kernel_builder.hw.scenarios import SCENARIOS, all_scenarios, parameter_table, scenario_params

DOC = Path(__file__).resolve().parents[1] / "docs" / "hardware-model.md"


def test_every_parameter_has_a_kind_a_source_and_an_ordered_range():
    rows = parameter_table()
    assert {r[0] for r in rows} == {f.name for f in dataclasses.fields(cost.CostParams)}
    for name, likely, opt, pess, kind, source in rows:
        assert kind in cost.KINDS and source, name
        # the optimistic end is the faster one: a rate or efficiency is higher, a cost lower
        lo, hi = sorted((opt, pess))
        assert lo <= likely <= hi, (name, opt, likely, pess)
    # no fitted efficiency knob: compute comes from counted instructions; launch_overhead_s is the one fit
    names = {f.name for f in dataclasses.fields(cost.CostParams)}
    assert not {n for n in names if "efficiency" in n}
    assert cost.FITTED == ("launch_overhead_s",)
    assert cost.PARAMS.ddr_bytes_per_s <= 63.0e9     # no higher than the best NPU2 measurement


def test_an_untagged_parameter_fails():
    @dataclasses.dataclass(frozen=True)
    class Untagged(cost.CostParams):
        new_rate: float = 1.0        # no kind, no source, no range

    with pytest.raises(ValueError, match="new_rate has no kind"):
        parameter_table(Untagged)


def test_every_parameter_is_in_the_doc_with_its_kind():
    doc = DOC.read_text()
    for name, likely, opt, pess, kind, source in parameter_table():
        # the cost-model table's row: name | likely | optimistic | pessimistic | kind | source
        rows = [r for r in re.findall(rf"^\| `{name}` \|.*$", doc, re.M) if r.count("|") == 7]
        assert rows, f"docs/hardware-model.md lacks the cost parameter {name} in the cost-model table"
        assert f"| {kind} |" in rows[0], (name, kind)


def test_unknown_scenario_is_one_clear_error():
    with pytest.raises(ValueError, match="unknown cost scenario 'best'"):
        scenario_params("best")


def _assert_ordered(name, works, vectorized=False, elf=True):
    t = {s: cost.module_seconds(works, p, vectorized, elf) for s, p in all_scenarios().items()}
    assert t["optimistic"] <= t["likely"] <= t["pessimistic"], (name, t)
    assert t["optimistic"] < t["pessimistic"], name


def test_scenarios_are_ordered_for_every_module():
    from multi_launch_builder.stitcher import stitch
    from llama_npu.models.llama import LLAMA32_1B, SMOLLM2_135M, LlamaModel

    for shapes in (LLAMA32_1B, SMOLLM2_135M):
        m = LlamaModel(shapes)
        for d in m.prefill(256).decls + m.head().decls + m.decode(2048).decls:
            rep = analyze_module(stitch(d), d.name)
            _assert_ordered(d.name, [la.work for la in rep.launches])
    for pt in reference_points() + registry_points():
        _assert_ordered(pt.name, pt.works, pt.vectorized_matmul, pt.elf)


def test_gemm_at_the_registry_shapes_brackets_the_measured_rate():
    """The counted model of the registry's f32-out GEMMs (xclbin, 8x4 herd, its tiles; gemm.cc's block-float
    instruction counts) is an output, not a fit: the registry's measured 7342-9797 GFLOPS (mlir-air
    kernel_registry GEMM_bf16_in_fp32_out.md) lies between the pessimistic and the optimistic modeled rate, +-10 %."""
    measured = {(2048, 2048, 2048): 8508, (2048, 2048, 8192): 8278, (2048, 8192, 2048): 9797, (2048, 2048, 512): 7342}
    sc = all_scenarios()
    for (m, k, n), meas in measured.items():
        rate = {s: 2 * m * k * n / cost.module_seconds([gemm(m, k, n, 64, 128, out_bytes=4)], p, True, elf=False)
                / 1e9 for s, p in sc.items()}
        assert rate["pessimistic"] * 0.9 <= meas <= rate["optimistic"] * 1.1, ((m, k, n), rate, meas)


def test_out_of_sample_calibration_runs_both_ways():
    v1, v2 = both_ways(registry_points(), reference_points(), "registry", "reference")
    for v in (v1, v2):
        assert len(v.fit_errors) + len(v.test_errors) == len(registry_points()) + len(reference_points())
        fm, fx = v.fit_mean_max
        tm, tx = v.test_mean_max
        assert math.isfinite(tm) and 0 <= fm <= fx and 0 <= tm <= tx
        assert "not refitted" in v.line()
    assert v1.test_mean_max[0] < 0.35     # registry-fitted parameters predict the reference modules
    assert v1.params != v2.params
    with pytest.raises(ValueError, match="non-empty"):
        validate([], reference_points(), "none", "reference")


def test_compute_seam_takes_counts_by_kind():
    w = gemm(2048, 2048, 2048, 64, 128)
    counts = cost.work_counts(w, vectorized_matmul=True)
    assert cost.launch_cost(w, vectorized_matmul=True).compute_s == cost.launch_cost(w, counts=counts).compute_s
    doubled = {k: 2 * v for k, v in counts.items()}
    assert math.isclose(cost.compute_cycles(doubled), 2 * cost.compute_cycles(counts))
    with pytest.raises(ValueError, match="unknown kind"):
        cost.compute_cycles({"mmul_8x8x8": 1})


def test_attention_is_charged_at_the_block_float_rate():
    """attention.cc's prefill item is compiled with the block-float flag (its vector path requires it: gemm.cc's
    way): its MACs are charged at the block-float mmul rate, none at the emulated one; the decode step uses no
    mmul."""
    from kernel_builder.attention import external as attention_ext

    assert ec.bfp16_mmul(attention_ext.attention_prefill_kernels(64, 64, 32, qcycle=8).update.defines)
    c, m = ec.external_cost("attnp_item_bf16_hd64_q64_k32_n8")
    w = c.work(m, [])
    assert w.mmul_macs == 2 * 64 * 32 * 64 and not w.emulated_mmul_macs
    assert w.counts["mmul_bfp16_8x8x8"] * 512 == w.mmul_macs


def test_bench_prints_like_for_like_figures(capsys):
    from benchmarks.hw_scenarios import bench_scenarios

    host = {"host_s_per_prefill": 0.25, "host_ms_per_decode_token": 5.0, "prompt_len": 2000}
    figs = bench_scenarios(host)
    out = capsys.readouterr().out
    for key in ("ours_prefill", "ours_decode", "ref_prefill", "ref_decode"):
        f = figs[key]
        assert f.total("optimistic") <= f.total("likely") <= f.total("pessimistic")
    assert math.isclose(figs["ours_prefill"].host_s, 0.25)
    line = next(l for l in out.splitlines() if "ours, prefill 2048 tokens" in l)
    assert line.index("likely") < line.index("optimistic") < line.index("pessimistic")
    assert "host 250.0 ms" in line
    assert "MEASURED on Strix" in out and "wall time 1.27 s" in out
    assert out.count("not refitted") == 2


def test_fitted_values_are_the_fit_of_the_calibration_points():
    """cost.CostParams' FITTED defaults are what `python -m benchmarks.hw_calibration` fits on all points
    (within 3 %), and their ranges contain the fit on the registry alone."""
    from benchmarks.hw_calibration import all_points

    fields = {f.name: f for f in dataclasses.fields(cost.CostParams)}
    start = dataclasses.replace(cost.PARAMS, **{n: getattr(cost.PRIOR, n) for n in cost.FITTED})
    fit_all = cost.calibrate(all_points(), start)
    fit_reg = cost.calibrate(registry_points(), start)
    for n in cost.FITTED:
        assert math.isclose(getattr(fit_all, n), getattr(cost.PARAMS, n), rel_tol=0.03), (n, getattr(fit_all, n))
        lo, hi = sorted((fields[n].metadata["optimistic"], fields[n].metadata["pessimistic"]))
        assert lo * 0.97 <= getattr(fit_reg, n) <= hi * 1.03, (n, getattr(fit_reg, n), lo, hi)


def test_a_columns_two_channels_share_its_measured_rate():
    """Two MM2S channels on one shim column move (1 + second_channel_gain) x one channel's bytes per second
    (fused_decode: 1.13x); on two columns each runs at the full channel rate; the DDR ceiling caps the total."""
    from kernel_builder.hw.results import Flow

    p = cost.PARAMS
    b = 10**8
    one_col = [Flow("MM2S", 0, "", b, 1, 1, column=0), Flow("MM2S", 0, "", b, 1, 1, column=0)]
    two_cols = [Flow("MM2S", 0, "", b, 1, 1, column=0), Flow("MM2S", 0, "", b, 1, 1, column=1)]
    rate = p.shim_channel_bytes_per_s
    assert cost.shim_seconds(one_col, p) == pytest.approx(2 * b / (rate * (1 + p.second_channel_gain)) + p.shim_task_s)
    assert cost.shim_seconds(two_cols, p) == pytest.approx(b / rate + p.shim_task_s)
    wide = [Flow("MM2S", 0, "", b, 1, 1, column=c % 8) for c in range(16)]
    assert cost.shim_seconds(wide, p) >= 16 * b / p.ddr_bytes_per_s


# ATB config 2's kernel call (mlir-aie programming_examples/ml/block_datatypes/gemm_asymmetric_tile_buffering/
# config2/mm_bfp_mixed.cc, read for its loop bounds: m 32 x k 128 x n 96 per call, 2x2 blocks of 8x8 output tiles)
# in our kinds: 768 block-float mmuls; per output block 16 k steps x (2 A + 2 B) block loads + its 4 C blocks
# loaded (12 blocks, 72 bytes a block); the 4 C blocks converted to accumulators and back; 4 block stores; one call
ATB2_CALL = {"mmul_bfp16_8x8x8": 768, "vload": 12 * (16 * 4 + 4), "vload_bytes": 12 * (16 * 4 + 4) * 72,
             "bfp16_convert": 12 * 8, "vstore": 12 * 4, "vstore_bytes": 12 * 4 * 72, "calls": 1}


def test_block_float_mmul_rate_is_bounded_by_the_measured_bfp16_gemms():
    """The published bfp16 GEMMs on 32 NPU2 cores (facts.py bfp16_gemm_tflops_measured) issued all their mmuls
    within their measured time: no scenario may charge one mmul more time than that allows. The best (31.3 TFLOPS,
    Strix) implies >= 326 MAC/cycle/core at clock_hz and >= 272 at the driver's turbo clock, both above the bf16
    rate (256): the former 2 cycles per 8x8x8 is refuted; one vector instruction per bundle at the int8 rate is
    the floor."""
    from kernel_builder.hw.facts import NPU2

    best = 1e12 * max(strix for _, strix, _ in NPU2.bfp16_gemm_tflops_measured)
    one_mmul_s = NPU2.core_tiles * 2 * 512 / best
    for s, p in all_scenarios().items():
        assert p.bfp16_mmul_cycles / p.clock_hz <= one_mmul_s, s
        assert p.bfp16_mmul_cycles >= 512 / NPU2.int8_macs_per_cycle, s
    macs = {clock: best / (NPU2.core_tiles * 2 * clock) for clock in (cost.PARAMS.clock_hz, NPU2.aie_clock_max_hz)}
    assert macs == pytest.approx({cost.PARAMS.clock_hz: 326.0, NPU2.aie_clock_max_hz: 271.7}, abs=0.1)
    assert min(macs.values()) > NPU2.bf16_mmul_macs_per_cycle
    assert cost.bfp16_mmul_cycles_bound() == pytest.approx(1.570, abs=1e-3)
    assert cost.bfp16_mmul_cycles_bound(NPU2.aie_clock_max_hz) == pytest.approx(1.884, abs=1e-3)
    assert cost.bfp16_mmul_cycles_bound(tflops=31.58) < cost.bfp16_mmul_cycles_bound()   # Krackan: tighter
    bf16_rate = dataclasses.replace(cost.PARAMS, bfp16_mmul_cycles=512 / NPU2.bf16_mmul_macs_per_cycle)
    assert bf16_rate.bfp16_mmul_cycles / bf16_rate.clock_hz > one_mmul_s


def test_counted_atb_kernel_brackets_its_measured_rate():
    """ATB config 2's kernel call counted in our kinds (compute only, every core busy; its data movement, its
    runtime sequence and its chess bundling are not ours to model, so it is a check, not a calibration point):
    the pessimistic and optimistic modeled rates bracket its measured 31.3 TFLOPS on Strix."""
    from kernel_builder.hw.facts import NPU2

    measured = 1e12 * dict((c, s) for c, s, _ in NPU2.bfp16_gemm_tflops_measured)[2]
    macs = ATB2_CALL["mmul_bfp16_8x8x8"] * 512
    rate = {s: 2 * macs * NPU2.core_tiles * p.clock_hz / cost.compute_cycles(ATB2_CALL, p)
            for s, p in all_scenarios().items()}
    assert rate["pessimistic"] <= measured <= rate["optimistic"], rate
    # likely: 25.8 TFLOPS at one cycle per mmul, under the measurement (its loads bind: 72 bytes per mmul at
    # load_bytes_per_cycle 64); any likely bfp16_mmul_cycles above 1 would only widen that gap
    assert rate["likely"] == pytest.approx(25.8e12, rel=0.01)
