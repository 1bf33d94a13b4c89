"""The emulator's bf16 GEMV (external_kernels/host/gemv_host.cc via kernel_builder.gemv.host): against an
f64 product and the BLAS f32 path, its fixed order (row blocks, threads, vector vs scalar build), and the emulator
handing it the stored bf16 weights.

Tolerance: f32 sums of k products of bf16 values, one bf16 rounding: |y - exact| <= 2^-8 |exact| + 2^-12 sum|w x|.
"""
from __future__ import annotations

import numpy as np
import pytest

from kernel_builder.gemv import host as hg
from external_kernels import host_build as hn
from kernel_builder import reference as ref
from multi_launch_builder.emulator.launch_program import LaunchSpec, ReferenceExecutor
from kernel_builder.numerics import BF16, to_bf16
from tooling import require_tool


@pytest.fixture(scope="module")
def lib():
    require_tool("g++")
    got = hn.library()
    assert got is not None, "the host kernels did not build"
    return got


def _wx(rng, m, k):
    return to_bf16(rng.standard_normal((m, k)) * 0.05), to_bf16(rng.standard_normal(k))


@pytest.mark.parametrize("m,k", [(96, 576), (7, 1536), (64, 45), (3000, 64)])
def test_matches_the_f64_product_and_the_blas_path(lib, m, k):
    rng = np.random.default_rng(m + k)
    w, x = _wx(rng, m, k)
    got = ref.gemv(w, x, m=m, k=k).astype(np.float32).reshape(m)        # bf16 weights: the host kernel
    blas = ref.gemv(w.astype(np.float32), x, m=m, k=k).astype(np.float32).reshape(m)   # f32: BLAS
    prods = w.astype(np.float64) * x.astype(np.float64)
    exact, scale = prods.sum(axis=1), np.abs(prods).sum(axis=1)
    for y in (got, blas):
        assert np.all(np.abs(y - exact) <= 2.0 ** -8 * np.abs(exact) + 2.0 ** -12 * scale)


def test_a_rows_bits_do_not_depend_on_blocks_or_threads(lib, monkeypatch):
    m, k = 5000, 576                       # above PARALLEL_MIN: row blocks on the pool
    assert m * k >= hg.PARALLEL_MIN
    rng = np.random.default_rng(1)
    w, x = _wx(rng, m, k)
    monkeypatch.setenv("LLAMA_NPU_EMU_THREADS", "1")
    one = hg.run(lib, w, x, m=m, k=k)
    monkeypatch.setenv("LLAMA_NPU_EMU_THREADS", "3")
    three = hg.run(lib, w, x, m=m, k=k)
    np.testing.assert_array_equal(one.view(np.uint32), three.view(np.uint32))
    part = hg.run(lib, np.ascontiguousarray(w[777:790]), x, m=13, k=k)     # alone, at another row offset
    np.testing.assert_array_equal(part.view(np.uint32), one[777:790].view(np.uint32))


def test_vector_and_scalar_builds_give_identical_f32(lib, tmp_path):
    scalar = hn.bind(hn.build(require_tool("g++"), tmp_path, ("-DLLAMA_NPU_SCALAR_ONLY",)))
    rng = np.random.default_rng(2)
    for m, k in ((40, 576), (9, 1000), (5, 31)):
        w, x = _wx(rng, m, k)
        a, b = hg.run(lib, w, x, m=m, k=k), hg.run(scalar, w, x, m=m, k=k)
        np.testing.assert_array_equal(a.view(np.uint32), b.view(np.uint32), err_msg=f"{m}x{k}")
    w = np.ones((6, 45), np.float32)          # non-finite weights: NaN of either sign, inf against -inf
    w[0, 6], w[0, 7] = -np.nan, np.nan
    w[1, 40], w[2, 3], w[2, 30] = np.nan, np.inf, -np.inf
    w[3, 0], w[4, 44] = np.inf, -np.inf
    w = to_bf16(w)
    x = np.ones(45, np.float32)
    a, b = hg.run(lib, w, x, m=6, k=45), hg.run(scalar, w, x, m=6, k=45)
    np.testing.assert_array_equal(a.view(np.uint32), b.view(np.uint32))
    assert np.isnan(a[:3]).all() and a[3] == np.inf and a[4] == -np.inf


def test_bad_input_is_refused(lib):
    w = np.zeros((4, 8), dtype=BF16)
    y = np.zeros(4, dtype=np.float32)
    call = lib.llama_npu_gemv_bf16
    assert call(w.ctypes.data, y.ctypes.data, y.ctypes.data, 4, 8, 0, 4) == 0
    for m, k, r0, r1 in ((0, 8, 0, 1), (4, 0, 0, 1), (4, 8, 3, 3), (4, 8, 0, 5), (4, 8, -1, 2)):
        assert call(w.ctypes.data, y.ctypes.data, y.ctypes.data, m, k, r0, r1) == -2
    with pytest.raises(ValueError, match="contiguous bf16 weights"):
        hg.run(lib, w.astype(np.float32), np.zeros(8, np.float32), m=4, k=8)


def test_the_emulator_hands_gemv_its_stored_bf16_weights(lib, monkeypatch):
    """ReferenceExecutor asks for a gemv's weight raw (bf16, no f32 shadow) when the host kernel is built, and
    for nothing else; without the kernels (or with a custom kernel table) every operand is the f32 shadow."""
    gemv = LaunchSpec(kind="gemv", operands=(3, 4, 5), reads=(0, 1), writes=(2,), params={"m": 4, "k": 8})
    rms = LaunchSpec(kind="rmsnorm", operands=(0, 1, 2), reads=(0, 1), writes=(2,), params={})
    assert ReferenceExecutor().raw_reads(gemv) == (0,)
    assert ReferenceExecutor().raw_reads(rms) == ()
    assert ReferenceExecutor(dict(ref.KERNELS)).raw_reads(gemv) == (0,)         # the real gemv in a copy
    assert ReferenceExecutor({**ref.KERNELS, "gemv": lambda w, x, **kw: w @ x}).raw_reads(gemv) == ()
    monkeypatch.setattr(hn, "_state", {"lib": None})
    assert ReferenceExecutor().raw_reads(gemv) == ()
