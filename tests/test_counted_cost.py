"""Counted compute (docs/hardware-model.md, "Counted compute"): a kernel call's modeled cycles come from its
descriptor's instruction counts (equal to the host aie_api's: tests/test_kernel_counts.py) through the cost
model's per-slot issue rates, so an edit of a kernel's counts - in its source or in its formula - changes the
modeled time."""
from __future__ import annotations

import math

import numpy as np
import pytest

from kernel_builder import aie_host
from kernel_builder import aie_host_runs as runs
from kernel_builder.external_costs import external_cost
from kernel_builder.hw import analyze_module, cost
from kernel_builder.hw.scenarios import all_scenarios
from tests.test_aie_host_strict import _mutant
from tests.tooling import require_tool

# one call of each kernel at a shape the Llama-3.2-1B builders use (operands: the GEMV's last K chunk, a fully
# visible prefill K/V item, a decode step seeing its whole tile)
CALLS = {
    "add_bf16_n4096": [], "swiglu_bf16_n4096": [], "rmsnorm_bf16_g2048_u2": [], "rope_bf16_hd64_h8_r8": [],
    "mv_bf16_k2048_c2048_m4_r128": [None] * 5 + [0], "gemm_mac_bf16_m64_k64_n64": [],
    "gemm_zero_bf16_m64_k64_n64": [], "gemm_out_bf16_m64_k64_n64": [],
    "attnp_item_bf16_hd64_q64_k64": [None, None, None, 1, 1, 0, 200], "attnp_finish_bf16_hd64_q64_k64": [],
    "attnd_step_bf16_hd64_q4_k64_n4": [None, None, 1000, 0], "attnd_merge_bf16_hd64_q4_k64_n4": [],
}


def counts_of(symbol: str, operands=()) -> dict:
    ec, m = external_cost(symbol)
    return {**ec.work(m, list(operands)).counts, "calls": 1}


def test_add_cycles_by_hand():
    """add_bf16_n4096: 128 steps of 3 widen/round + 1 accumulator add in the vector slot (512 cycles), 256 loads
    of 64 B (load slot: 256 cycles at 64 B/cycle), 128 stores of 64 B (store slot: 256 at 32 B/cycle)."""
    p = cost.PARAMS
    slots = cost.slot_cycles(counts_of("add_bf16_n4096"), p)
    assert slots == {"vector": 512, "move": 0, "load": 256, "store": 256, "scalar": 0}
    assert math.isclose(cost.compute_cycles(counts_of("add_bf16_n4096"), p),
                        512 + (1 - p.vliw_overlap) * 512 + p.call_overhead_cycles)


def test_gemm_mac_cycles_by_hand():
    """gemm_mac 64x64x64: 512 block-float 8x8x8 mmuls; the 64 a blocks widened and converted to bfp16 once per
    call (kept in the block-float scratch), the 64 w blocks likewise once per call (in place over the w tile);
    no transposes, no ones-multiply (gemm.cc feeds w to mac_8x8_8x8T as stored)."""
    p = cost.PARAMS
    c = counts_of("gemm_mac_bf16_m64_k64_n64")
    assert c["mmul_bfp16_8x8x8"] == 512 and c["bfp16_convert"] == 64 + 64 and c.get("shuffle", 0) == 0
    assert c.get("vmac_bf16", 0) == 0
    vector = 512 * p.bfp16_mmul_cycles + 128 + c["vconvert"]
    assert math.isclose(cost.slot_cycles(c, p)["vector"], vector)
    # the counted rate is what the fitted gemm_efficiency used to be: well under the block-float peak (512 MACs
    # per bfp16_mmul_cycles), half of it at most (the conversions, loads and the call take their share)
    rate = 64 ** 3 / cost.compute_cycles(c, p)
    assert 40 < rate < 512 / p.bfp16_mmul_cycles / 2, rate


@pytest.mark.parametrize("symbol", sorted(CALLS))
def test_counted_cycles_of_every_kernel(symbol):
    """Every kernel's call has counted cycles, ordered over the scenarios, at least its busiest slot."""
    c = counts_of(symbol, CALLS[symbol])
    cyc = {s: cost.compute_cycles(c, p) for s, p in all_scenarios().items()}
    assert 0 < cyc["optimistic"] <= cyc["likely"] <= cyc["pessimistic"], (symbol, cyc)
    assert cyc["likely"] >= max(cost.slot_cycles(c).values())


def test_block_float_attention_is_cheaper():
    """attention.cc's prefill item on pre-blocked K/V (block-float 8x8x8, two outputs per converted block, V
    transposed once per item, Q pre-scaled) costs about half the counted cycles of its former 4-row path compiled
    with aie_api's block-float flag (operands gathered with 128-bit loads and converted per mac: the proxy of
    the reference design's attention, benchmarks/hw_calibration.py)."""
    from benchmarks.hw_calibration import _reference_attention_item
    from kernel_builder.attention import counts as ac
    new = ac.prefill_item(64, 64, 64, 1, 1, 0, 200)
    former = _reference_attention_item(64, 64, 64)
    assert new["mmul_bfp16_8x8x8"] * 2 == former["mmul_bfp16_8x8x8"]    # one 8x8x8 = two 4x8x8 steps
    assert cost.compute_cycles(new) < 0.6 * cost.compute_cycles(former)


def test_doubling_a_kernels_mac_count_changes_the_modeled_time(monkeypatch):
    """A formula edit that doubles the GEMM's MAC loop (its mmuls and their operand work) raises the modeled
    compute of a GEMM module's launch accordingly."""
    from kernel_builder.gemm import builder
    from kernel_builder.gemm import external as gemm_ext

    text = builder.build(256, 2048, 2048)
    base = analyze_module(text, "g").launches[0].work
    real = gemm_ext.gemm_mac_counts

    def doubled(tm, tk, tn, block_float=True):
        c = real(tm, tk, tn, block_float)
        return c + c   # the K loop run twice
    monkeypatch.setattr(gemm_ext, "gemm_mac_counts", doubled)
    edit = analyze_module(text, "g").launches[0].work
    assert edit.tile_mmul_macs == 2 * base.tile_mmul_macs
    b, e = cost.launch_cost(base).compute_s, cost.launch_cost(edit).compute_s
    assert 1.8 * b < e < 2.0 * b      # the zero / out calls and the call overhead do not double


def test_a_kernel_source_edit_changes_its_counted_time(tmp_path):
    """gemm.cc without its two-row-block unroll (same results, same MACs, every block-float W block reloaded
    once per row block): the host counts of the edited source differ from the descriptor's (the descriptor test
    fails until the formula follows) and cost more cycles."""
    require_tool("g++")
    obj = "gemm_m64_k64_n64.o"
    lib = _mutant(tmp_path, obj, "gemm.cc", r"kUM = \(kMB % 2 == 0\) \? 2 : 1;", "kUM = 1;")
    edit = runs.run(obj, np.random.default_rng(4), lib).counts
    desc = {k: v for k, v in counts_of("gemm_mac_bf16_m64_k64_n64").items() if k != "calls"}
    assert {k: v for k, v in edit.items() if v} != desc
    assert cost.compute_cycles(edit) > cost.compute_cycles(desc)
    base = runs.run(obj, np.random.default_rng(4), aie_host.load(runs.kernel_of(obj))).counts
    assert {k: v for k, v in base.items() if v} == desc
