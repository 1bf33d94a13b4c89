"""The `gemm_q4` kernel (the q4 prefill GEMM dequantizing its W slices in L1): the AIE2P vector path on the host
aie_api gives the bits of gemm.cc's mac on the dequant_q4 weight (the same dequantization, the same mac), its counts
equal the cost descriptor, an off-by-one mutant fails; the C++ scalar path and the emu-interp module equal the numpy
reference (gemm on format.dequantize) bit for bit; the plan and the hardware model at SmolLM2 / Llama shapes."""
from __future__ import annotations

import re

import numpy as np
import pytest

from external_kernels.paths import SOURCE_DIR
from kernel_builder import aie_host
from kernel_builder.aie_host_runs import block
from kernel_builder.dequant_q4.reference import dequant_q4
from kernel_builder.gemm.external import gemm_kernels, scratch_elems
from kernel_builder.gemm_q4 import external as q4g
from kernel_builder.gemm_q4.plan import plan_gemm_q4
from kernel_builder.gemm_q4.reference import gemm_q4
from kernel_builder.gemv_q4.format import Q4Layout, pack
from kernel_builder.instr_counts import Counts
from kernel_builder.numerics import BF16, to_bf16

A = aie_host.aligned
TILES = [(16, 64, 32, 32), (8, 256, 48, 128)]     # (tile_m, tile_k, tile_n, group): SmolLM2-like, AWQ group


def _q4_rows(rng, n, k, group):
    codes = rng.integers(0, 16, size=(n, k))
    s = to_bf16(rng.uniform(0.01, 0.1, size=(n, k // group)).astype(np.float32))
    z = to_bf16(rng.uniform(-0.5, 0.0, size=(n, k // group)).astype(np.float32))
    return pack(codes, s, z, group)


def _slice(rows, k, group, k0, tk):
    """The L1 W slice of columns [k0, k0 + tk) of these q4 rows (gemm_q4.cc's layout)."""
    lay = Q4Layout(k, group, True)
    codes = rows[:, k0 // 2:(k0 + tk) // 2]
    g0, g1 = k0 // group, (k0 + tk) // group
    sc = rows[:, lay.scale_offset + 2 * g0:lay.scale_offset + 2 * g1]
    mn = rows[:, lay.min_offset + 2 * g0:lay.min_offset + 2 * g1]
    return np.ascontiguousarray(np.concatenate([codes.reshape(-1), np.concatenate([sc, mn], axis=1).reshape(-1)]))


def _run(t, lib=None, steps=2):
    tm, tk, tn, g = t
    rng = np.random.default_rng(tm + tk)
    k = steps * tk
    rows = _q4_rows(rng, tn, k, g)
    a = to_bf16(rng.standard_normal((tm, k)).astype(np.float32))
    ks = q4g.gemm_q4_kernels(tm, tk, tn, g)
    lib = lib or aie_host.load(ks.mac)
    acc = A(np.full(2 * tm * tn, np.nan, BF16))
    scratch, wst = A(np.zeros(scratch_elems(tm, tk), BF16)), A(np.zeros(tn * tk, BF16))
    lib.call(ks.zero.symbol, acc)
    counts = None
    for s in range(steps):
        c = lib.call(ks.mac.symbol, A(block(a[:, s * tk:(s + 1) * tk])), A(_slice(rows, k, g, s * tk, tk)), acc,
                     scratch, wst)
        counts = counts or c
    lib.call(ks.out.symbol, acc)
    return acc[:tm * tn].copy(), (a, rows, k), counts


def _bf16_gemm(t, a, rows, k):
    """gemm.cc's mac (host aie_api) on dequant_q4's bf16 weight: what dequant_q4 + gemm compute."""
    tm, tk, tn, g = t
    w = dequant_q4(rows, m=tn, k=k, group=g, mins=1)
    ks = gemm_kernels(tm, tk, tn)
    lib = aie_host.load(ks.mac)
    acc = A(np.full(2 * tm * tn, np.nan, BF16))
    scratch = A(np.zeros(scratch_elems(tm, tk), BF16))
    lib.call(ks.zero.symbol, acc)
    for s in range(k // tk):
        lib.call(ks.mac.symbol, A(block(a[:, s * tk:(s + 1) * tk])), A(block(w[:, s * tk:(s + 1) * tk])), acc, scratch)
    lib.call(ks.out.symbol, acc)
    return acc[:tm * tn].copy()


@pytest.mark.parametrize("t", TILES, ids=lambda t: "m{}_k{}_n{}_g{}".format(*t))
def test_vector_path_is_dequant_q4_plus_gemm_and_counts(t):
    got, (a, rows, k), counts = _run(t)
    np.testing.assert_array_equal(got, _bf16_gemm(t, a, rows, k))
    ks = q4g.gemm_q4_kernels(*t)
    cost = q4g.COSTS[1]
    formula = cost.work(cost.pattern.fullmatch(ks.mac.symbol), []).counts
    assert Counts._of(formula).host() == {kind: v for kind, v in counts.items() if v}


def test_off_by_one_in_the_vector_path_fails(tmp_path):
    text = (SOURCE_DIR / "gemm_q4.cc").read_text()
    mutated, n = re.subn(r"\(n % kBlock\) \* kBlock;", "((n + 1) % kBlock) * kBlock;", text)
    assert n == 1
    src = tmp_path / "gemm_q4.cc"
    src.write_text(mutated)
    (tmp_path / "gemm.cc").write_text((SOURCE_DIR / "gemm.cc").read_text())
    (tmp_path / "kernel_common.h").write_text((SOURCE_DIR / "kernel_common.h").read_text())
    t = TILES[0]
    got, (a, rows, k), _ = _run(t, aie_host.load(q4g.gemm_q4_kernels(*t).mac, source=src))
    assert not np.array_equal(got, _bf16_gemm(t, a, rows, k))


@pytest.mark.parametrize("m,k,n,group", [(64, 576, 192, 32), (64, 256, 96, 128)])
def test_builder_on_the_interpreter(m, k, n, group):
    from multi_launch_builder.emulator import air_interp
    from kernel_builder.registry import kernel_text
    rng = np.random.default_rng(3)
    rows = _q4_rows(rng, n, k, group)
    a = to_bf16(rng.standard_normal((m, k)).astype(np.float32))
    c = np.zeros((m, n), BF16)
    air_interp.compile_module(kernel_text("gemm_q4", m, k, n, group)).run([a, rows.view(np.int8), c])
    want = gemm_q4(a, rows, m=m, k=k, n=n, group=group)
    # the interpreter runs the C++ scalar path's model (f32 accumulation in ascending k, like the reference's BLAS
    # up to order): gemm's tolerance
    err = np.abs(c.astype(np.float64) - want.astype(np.float64))
    assert np.all(err <= 2.0**-7 * np.abs(want.astype(np.float64)) + 2.0**-10 * np.abs(want).max())


@pytest.mark.parametrize("m,k,n", [(256, 2048, 2048), (256, 2048, 8192), (256, 8192, 2048), (2048, 2048, 8192),
                                   (64, 576, 1536), (64, 1536, 576), (64, 4096, 14336)])
def test_hardware_model_accepts(m, k, n):
    from kernel_builder.hw import analyze_module
    from kernel_builder.hw.tune import runtime_tiling
    from kernel_builder.presets import AirccPreset
    from kernel_builder.registry import kernel_text
    text = kernel_text("gemm_q4", m, k, n)
    rep = analyze_module(text, preset=AirccPreset(runtime_loop_tiling_sizes=runtime_tiling(text)))
    assert rep.ok, rep.first_violation()


def test_plan_limits():
    p = plan_gemm_q4(256, 2048, 2048)
    assert p.l1_bytes() <= 64 * 1024 and p.tile_k % 64 == 0
    with pytest.raises(ValueError, match="k=96 must be a multiple of 64"):
        plan_gemm_q4(64, 96, 64)


def test_the_model_prefers_it_for_short_chunks_only():
    """Llama-3.2-1B widths: gemm_q4 where the counted model times it below dequant_q4 + gemm (256-row chunks: the
    q / k / v / o / gate / up projections), the scratch path at 2048 rows (each weight dequantized by all 8 herd
    rows per 256-row block: compute-bound)."""
    from kernel_builder.gemm_q4.plan import prefer_l1
    assert prefer_l1(256, 2048, 2048, 32) and prefer_l1(256, 2048, 8192, 32) and prefer_l1(64, 576, 192, 32)
    assert not prefer_l1(2048, 2048, 8192, 32)
    assert not prefer_l1(256, 576, 576, 128)      # k not a multiple of 2 x 128: no plan
