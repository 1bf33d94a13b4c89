"""The emulator's host q4/q8 GEMV (external_kernels/host/gemv_q4_host.cc) on every build this machine can make:
native (AVX-512 with the one-instruction bf16 rounding where the CPU has AVX512-BF16), AVX-512 with the integer
rounding only, AVX2, scalar. All give the same f32 bits, also on what the fast paths treat specially: rows in
pairs (odd row counts, row ranges starting anywhere), odd group counts (two groups' tables made at once), and
scales or mins that are subnormal, tiny (< 2^-100, where the hardware rounding would flush), infinite or NaN
next to ordinary rows (such a row and its pair take the integer rounding)."""
from __future__ import annotations

import numpy as np
import pytest
from tooling import require_tool

from kernel_builder.gemv_q4.format import Q4Layout, pack
from kernel_builder.numerics import to_bf16


@pytest.fixture(scope="module")
def builds(tmp_path_factory):
    from external_kernels import host_build as hn
    native = hn.library()
    if native is None:
        pytest.skip("no host kernels")
    cxx = require_tool("g++")
    tmp = tmp_path_factory.mktemp("q4paths")
    return {"native": native,
            "no-bf16cvt": hn.bind(hn.build(cxx, tmp / "nocvt", ("-DLLAMA_NPU_NO_BF16CVT",))),
            "avx2": hn.bind(hn.build(cxx, tmp / "avx2", ("-DLLAMA_NPU_NO_AVX512",))),
            "scalar": hn.bind(hn.build(cxx, tmp / "scalar", ("-DLLAMA_NPU_SCALAR_ONLY",)))}


def _rows(rng, m, k, group, mins, bits):
    lo, hi = ((0, 2**bits) if mins else (-(2 ** (bits - 1)), 2 ** (bits - 1)))
    codes = rng.integers(lo, hi, size=(m, k))
    s = to_bf16(rng.uniform(0.001, 0.1, size=(m, k // group)).astype(np.float32))
    z = to_bf16(rng.uniform(-0.5, 0.0, size=(m, k // group)).astype(np.float32)) if mins else None
    return codes, s, z


# scales / mins the hardware rounding must not see: subnormal bf16, tiny normal, the 2^-100 edge, inf, NaN, -0
WILD = np.array([1e-40, -3e-39, 2.0**-101, 2.0**-100, np.inf, np.nan, -0.0, 3e38], np.float32)


def _call(lib, bits, p, x, m, k, group, mins, ranges):
    fn = lib.llama_npu_gemv_q8 if bits == 8 else lib.llama_npu_gemv_q4
    rb = Q4Layout(k, group, bool(mins), bits).row_bytes
    y = np.full(m, 7.0, np.float32)
    for r0, r1 in ranges:
        assert fn(p.ctypes.data, x.ctypes.data, y.ctypes.data, m, k, group, mins, rb, r0, r1) == 0
    return y.view(np.uint32)


@pytest.mark.parametrize("m,k,group,mins,bits", [(9, 96, 32, 1, 4), (7, 96, 32, 0, 4), (10, 384, 128, 1, 4),
                                                 (9, 576, 32, 0, 8), (6, 64, 32, 1, 8)])
def test_all_builds_give_the_same_bits(builds, m, k, group, mins, bits):
    rng = np.random.default_rng(m * k + group + bits)
    codes, s, z = _rows(rng, m, k, group, mins, bits)
    for r, v in zip((1, 4, m - 1), rng.choice(WILD, 3)):      # three rows with one wild scale (or min) each
        (z if mins and r == 4 else s)[r, r % s.shape[1]] = to_bf16(v)
    p = pack(codes, s, z, group, bits=bits)
    x = rng.standard_normal(k).astype(np.float32)
    got = {name: _call(lib, bits, p, x, m, k, group, mins, ((0, 3), (3, 4), (4, m))) for name, lib in builds.items()}
    for name in builds:
        np.testing.assert_array_equal(got[name], got["scalar"], err_msg=f"{name}: {m}x{k} g{group} z{mins} b{bits}")
    assert not np.array_equal(got["scalar"], np.full(m, 7.0, np.float32).view(np.uint32))


def test_the_guard_matters(tmp_path):
    """A mutant build that gives every row the hardware rounding (no tame_row guard) differs from the scalar bits
    on the wild scales above: the cases reach what the guard protects (on a CPU with AVX512-BF16)."""
    from external_kernels import host_build as hn
    from pathlib import Path
    flags = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    if "avx512_bf16" not in flags or hn.library() is None:
        pytest.skip("no AVX512-BF16 here: the native build has no hardware rounding to guard")
    cxx = require_tool("g++")
    libs = {"mutant": hn.bind(hn.build(cxx, tmp_path / "mut", ("-DLLAMA_NPU_Q4_UNGUARDED",))),
            "scalar": hn.bind(hn.build(cxx, tmp_path / "sca", ("-DLLAMA_NPU_SCALAR_ONLY",)))}
    rng = np.random.default_rng(5)
    for bits in (4, 8):
        codes, s, z = _rows(rng, 4, 96, 32, 1, bits)
        codes[1] = 0
        z[1] = to_bf16(np.float32(-1e-40))          # row 1: every weight a subnormal min (flushed by the hardware)
        s[2], z[2] = to_bf16(np.float32(2e-39)), 0   # row 2: subnormal scale, every weight d * q subnormal
        p = pack(codes, s, z, 32, bits=bits)
        x = rng.uniform(0.5, 1.0, 96).astype(np.float32)
        got = {n: _call(lib, bits, p, x, 4, 96, 32, 1, ((0, 4),)) for n, lib in libs.items()}
        assert not np.array_equal(got["mutant"], got["scalar"]), bits
        np.testing.assert_array_equal(_call(hn.library(), bits, p, x, 4, 96, 32, 1, ((0, 4),)), got["scalar"])
