"""`gemv_q4_swiglu` (kernel_builder/gemv_q4_swiglu): a 4-bit decode's gate and up projections and their SwiGLU in
ONE launch. Its AIE2P vector path (gemv_q4.cc with Q4_SWIGLU_SYMBOL: the GEMV steps over the tile's gate then up
rows, then swiglu.cc's code on them) on the host aie_api against the reference, with the counts of its cost
descriptor; an off-by-one in the SwiGLU entry fails; the module on the interpreter is bit for bit the three
launches it replaces; the hardware model accepts it at SmolLM2-135M, Llama-3.2-1B and Llama-3.1-8B shapes; the
q4 decode layer uses it (bf16 and prefill keep their launches); a shape without a vector-sized tile is one line."""
from __future__ import annotations

import re

import numpy as np
import pytest
from tooling import require_tool

from kernel_builder import aie_host
from kernel_builder.numerics import BF16, to_bf16
from kernel_builder.reference import KERNELS
from tests.test_gemv_q4 import _close, _random_q4

V = (256, 32, 1, 4, 64)    # (k, group, mins, tile_m, 2R): 32 gate rows then 32 up rows per tile


def _run(v, lib=None, seed=3):
    """One tile: the GEMV steps over its gate rows then its up rows into y [2R], then the SwiGLU entry."""
    from kernel_builder.gemv_q4.external import gemv_q4_kernel, swiglu_symbol

    k, group, mins, tm, rows = v
    kern = gemv_q4_kernel(*v, swiglu=True)
    lib = lib or aie_host.load(kern)
    rng = np.random.default_rng(seed)
    half = rows // 2
    pg, *_ = _random_q4(rng, half, k, group, mins)
    pu, *_ = _random_q4(rng, half, k, group, mins)
    x = to_bf16(rng.standard_normal(k).astype(np.float32) * 0.5)
    p = np.concatenate([pg, pu])
    xa, y = aie_host.aligned(x), aie_host.aligned(np.zeros(rows, BF16))
    for r in range(0, rows, tm):
        lib.call(kern.symbol, aie_host.aligned(np.ascontiguousarray(p[r:r + tm])), xa, y, r)
    act = aie_host.aligned(np.zeros(half, BF16))
    counts = lib.call(swiglu_symbol(kern), y, act)
    want = KERNELS["gemv_q4_swiglu"](pg, pu, x, m=half, k=k, group=group, mins=mins).reshape(-1)
    return act, want, counts, kern


def test_vector_path_matches_reference_and_counts():
    from kernel_builder.gemv_q4_swiglu.external import COSTS
    from kernel_builder.gemv_q4.external import swiglu_symbol
    from kernel_builder.instr_counts import Counts

    require_tool("g++")
    act, want, counts, kern = _run(V)
    _close(act, want, "gemv_q4_swiglu")
    assert np.any(want.astype(np.float32) != 0)
    cost = COSTS[1]
    formula = cost.work(cost.pattern.fullmatch(swiglu_symbol(kern)), []).counts
    assert Counts._of(formula).host() == {k: n for k, n in counts.items() if n}


def test_off_by_one_in_the_swiglu_entry_fails(tmp_path):
    from external_kernels.paths import SOURCE_DIR

    require_tool("g++")
    mutated, n = re.subn(r"SWIGLU_SYMBOL\(y, y \+ SWIGLU_N, act\)", "SWIGLU_SYMBOL(y, y + SWIGLU_N - 1, act)",
                         (SOURCE_DIR / "gemv_q4.cc").read_text())
    assert n == 1
    (tmp_path / "gemv_q4.cc").write_text(mutated)
    from kernel_builder.gemv_q4.external import gemv_q4_kernel
    lib = aie_host.load(gemv_q4_kernel(*V, swiglu=True), source=tmp_path / "gemv_q4.cc")
    # the up rows read one element early: a misaligned vector load (the host aie_api refuses it, as AIE2P would
    # load the aligned vector below it), or, were it aligned, wrong values
    with pytest.raises((AssertionError, aie_host.AieHostError)):
        act, want, _, _ = _run(V, lib)
        _close(act, want, "mutant")


def test_module_on_the_interpreter_equals_the_three_launches():
    from kernel_builder.registry import kernel_text
    from multi_launch_builder.emulator import air_interp

    m, k = 256, 512
    rng = np.random.default_rng(2)
    pg, *_ = _random_q4(rng, m, k, 32, 1)
    pu, *_ = _random_q4(rng, m, k, 32, 1)
    x = to_bf16(rng.standard_normal((1, k)).astype(np.float32))
    y = np.zeros((1, m), BF16)
    air_interp.compile_module(kernel_text("gemv_q4_swiglu", m, k, 32, 1)).run([pg.view(np.int8), pu.view(np.int8),
                                                                                x, y])
    three = KERNELS["swiglu"](KERNELS["gemv_q4"](pg, x, m=m, k=k, group=32, mins=1),
                              KERNELS["gemv_q4"](pu, x, m=m, k=k, group=32, mins=1), rows=1, dim=m)
    np.testing.assert_array_equal(y.view(np.uint16), three.view(np.uint16))


@pytest.mark.parametrize("m,k", [(1536, 576), (8192, 2048), (14336, 4096)])
def test_hardware_model_accepts_model_shapes(m, k):
    from kernel_builder.hw import analyze_module
    from kernel_builder.registry import kernel_text

    fused = analyze_module(kernel_text("gemv_q4_swiglu", m, k, 32, 1))
    assert fused.ok, fused.first_violation()
    plain = analyze_module(kernel_text("gemv_q4", m, k, 32, 1))
    # one launch streaming both matrices: less than the two GEMV launches alone (the swiglu launch apart)
    assert fused.modeled_s - fused.params.dispatch_overhead_s < 2 * (plain.modeled_s - plain.params.dispatch_overhead_s)


def test_q4_decode_layer_fuses_gate_up_and_swiglu():
    from llama_npu.models.llama import LLAMA32_1B, LlamaModel

    kinds = [la.build.args[0] for la in LlamaModel(LLAMA32_1B, "q4").decode(1024).decls[0].launches]
    assert kinds.count("gemv_q4_swiglu") == 1 and "swiglu" not in kinds and kinds.count("gemv_q4") == 3
    bf16 = [la.build.args[0] for la in LlamaModel(LLAMA32_1B).decode(1024).decls[0].launches]
    assert "swiglu" in bf16 and "gemv_q4_swiglu" not in bf16
    prefill = [la.build.args[0] for d in LlamaModel(LLAMA32_1B, "q4").prefill(256).decls for la in d.launches]
    assert "gemv_q4_swiglu" not in prefill


def test_no_vector_sized_tile_is_one_line():
    from kernel_builder.gemv_q4_swiglu.plan import plan_gemv_q4_swiglu

    with pytest.raises(ValueError, match="gemv_q4_swiglu: m=48 gives no herd whose tiles own a multiple of 32"):
        plan_gemv_q4_swiglu(48, 256, 32, 1)
