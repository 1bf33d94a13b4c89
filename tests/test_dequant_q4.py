"""The `dequant_q4` kernel (the q4 prefill's per-layer weight dequantization): the C++ scalar path and the AIE2P
vector path (host aie_api, int4 ops) equal the numpy reference bit for bit (both compute format.dequantize's f32
ops with one RNE rounding), its counted cost formula equals the host's counts, an off-by-one mutant fails, the
module text on emu-interp, the plan's limits and the hardware model at Llama-3.2-1B / 3.1-8B shapes."""
from __future__ import annotations

import ctypes
import re
import subprocess

import numpy as np
import pytest
from tooling import require_tool

from external_kernels import compile_rules
from external_kernels.paths import SOURCE_DIR
from kernel_builder import aie_host
from kernel_builder.dequant_q4 import external as dq_ext
from kernel_builder.dequant_q4.plan import plan_dequant_q4
from kernel_builder.dequant_q4.reference import dequant_q4
from kernel_builder.gemv_q4.format import pack
from kernel_builder.instr_counts import Counts
from kernel_builder.numerics import BF16, to_bf16

VARIANTS = [(576, 32, 1, 2), (256, 128, 1, 3), (256, 32, 0, 1)]   # (k, group, mins, tile_m)


def _random_q4(rng, m, k, group, mins):
    lo, hi = (0, 16) if mins else (-8, 8)
    codes = rng.integers(lo, hi, size=(m, k))
    s = to_bf16(rng.uniform(0.01, 0.1, size=(m, k // group)).astype(np.float32))
    z = to_bf16(rng.uniform(-0.5, 0.0, size=(m, k // group)).astype(np.float32)) if mins else None
    return pack(codes, s, z, group)


@pytest.fixture(scope="module")
def scalar_lib(tmp_path_factory):
    cxx = require_tool("g++")
    out = tmp_path_factory.mktemp("dq4_host")
    objs = []
    for v in VARIANTS:
        k = dq_ext.dequant_q4_kernel(*v)
        cmd = compile_rules.host_compile_command(k, out, cxx=cxx) + ["-Wall", "-Wextra"]
        res = subprocess.run(cmd, capture_output=True, text=True)
        assert res.returncode == 0 and "warning" not in res.stderr, res.stderr
        objs.append(out / compile_rules.host_object_name(k))
    so = out / "libdq4.so"
    subprocess.run(compile_rules.host_link_command(objs, so, cxx=cxx), check=True)
    return ctypes.CDLL(str(so))


@pytest.mark.parametrize("v", VARIANTS)
def test_scalar_path_matches_reference(scalar_lib, v):
    k, group, mins, tm = v
    p = _random_q4(np.random.default_rng(5), tm, k, group, mins)
    y = np.zeros(tm * k, BF16)
    f = getattr(scalar_lib, dq_ext.dequant_q4_kernel(*v).symbol)
    f.argtypes = [ctypes.c_void_p] * 2
    f(np.ascontiguousarray(p).ctypes.data, y.ctypes.data)
    np.testing.assert_array_equal(y.reshape(tm, k), dequant_q4(p, m=tm, k=k, group=group, mins=mins))


def _vector_run(v, lib=None):
    k, group, mins, tm = v
    kern = dq_ext.dequant_q4_kernel(*v)
    lib = lib or aie_host.load(kern)
    p = _random_q4(np.random.default_rng(6), tm, k, group, mins)
    y = aie_host.aligned(np.zeros(tm * k, BF16))
    counts = lib.call(kern.symbol, aie_host.aligned(np.ascontiguousarray(p)), y)
    return y.reshape(tm, k), dequant_q4(p, m=tm, k=k, group=group, mins=mins), counts


@pytest.mark.parametrize("v", VARIANTS)
def test_vector_path_matches_reference_and_counts(v):
    y, want, counts = _vector_run(v)
    np.testing.assert_array_equal(y, want)
    k, group, mins, tm = v
    assert counts["unpack"] == tm * k // 32 and counts["vload_bytes"] == tm * k // 2
    kern = dq_ext.dequant_q4_kernel(*v)
    cost = dq_ext.COSTS[0]
    formula = cost.work(cost.pattern.fullmatch(kern.symbol), []).counts
    assert Counts._of(formula).host() == {k2: n for k2, n in counts.items() if n}


def test_off_by_one_in_the_vector_path_fails(tmp_path):
    v = VARIANTS[0]
    text = (SOURCE_DIR / "dequant_q4.cc").read_text()
    mutated, n = re.subn(r"c < \(g \+ 1\) \* DQ4_G; c \+= kLanes\) \{\n        const auto q = (.*)wr \+ c / 2",
                         r"c < (g + 1) * DQ4_G; c += kLanes) {\n        const auto q = \1wr + c / 2 + 16", text)
    assert n == 1
    src = tmp_path / "dequant_q4.cc"
    src.write_text(mutated)
    y, want, _ = _vector_run(v, aie_host.load(dq_ext.dequant_q4_kernel(*v), source=src))
    assert not np.array_equal(y, want)


@pytest.mark.parametrize("m,k,group,mins", [(48, 576, 32, 1), (32, 256, 128, 1), (16, 256, 32, 0)])
def test_builder_on_the_interpreter(m, k, group, mins):
    from multi_launch_builder.emulator import air_interp
    from kernel_builder.registry import kernel_text
    p = _random_q4(np.random.default_rng(9), m, k, group, mins)
    y = np.zeros((m, k), BF16)
    plan = plan_dequant_q4(m, k, group, mins)
    stats = air_interp.compile_module(kernel_text("dequant_q4", m, k, group, mins)).run([p.view(np.int8), y])
    assert stats.tiles == plan.tiles
    assert stats.dma_bytes == p.nbytes + y.nbytes          # every q4 row in once, every bf16 row out once
    np.testing.assert_array_equal(y, dequant_q4(p, m=m, k=k, group=group, mins=mins))


def test_plan_limits():
    p = plan_dequant_q4(4096, 14336, 32, 1)               # Llama-3.1-8B down_proj: one 28 KiB bf16 row per step
    assert p.tile_m == 1 and p.l1_bytes() <= 60 * 1024
    with pytest.raises(ValueError, match="k=100 must be a multiple of 32"):
        plan_dequant_q4(64, 100, 32, 1)
    with pytest.raises(ValueError, match="needs .* of L1 per tile"):
        plan_dequant_q4(8, 32768, 32, 1)


@pytest.mark.parametrize("m,k,group", [(2048, 2048, 32), (512, 2048, 32), (8192, 2048, 32), (2048, 8192, 32),
                                       (4096, 4096, 32), (14336, 4096, 32), (4096, 14336, 32), (1536, 576, 32),
                                       (14336, 4096, 128), (4096, 14336, 128)])
def test_hardware_model_accepts_llama_shapes(m, k, group):
    from kernel_builder.hw import analyze_module
    from kernel_builder.registry import kernel_text
    rep = analyze_module(kernel_text("dequant_q4", m, k, group, 1))
    assert rep.ok, rep.first_violation()


def test_host_kernel_equals_numpy_dequantize():
    """The emulator's host dequantization (external_kernels/host/gemv_q4_host.cc) gives format.dequantize's bits."""
    from external_kernels import host_build
    from kernel_builder.gemv_q4.format import dequantize
    if host_build.library() is None:
        pytest.skip("no host kernels")
    for m, k, group, mins in ((40, 576, 32, 1), (24, 256, 128, 1), (16, 256, 32, 0)):
        p = _random_q4(np.random.default_rng(10), m, k, group, mins)
        np.testing.assert_array_equal(dequant_q4(p, m=m, k=k, group=group, mins=mins),
                                      dequantize(p, k, group, bool(mins)))
