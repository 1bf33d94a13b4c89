"""The emulator's host attention kernel (external_kernels/host/attention_host.cc via
kernel_builder.attention.host) against the numpy path, its own promises (a row's bits do not depend on the
chunk, the thread count or the vector/scalar build) and its fallbacks.

Tolerance against `attention_numpy` (f64 products): both round once to bf16 from results that differ in the
last f32 bits, so an element differs by at most one bf16 ulp of itself plus 2^-10 of the row's largest value.
"""
from __future__ import annotations

import ctypes

import numpy as np
import pytest

from kernel_builder.attention import host as ha
from external_kernels import host_build as hn
from kernel_builder import reference as ref
from kernel_builder.numerics import to_bf16
from tooling import require_tool

SHAPES = [  # heads, kv_heads, head_dim
    (9, 3, 64),    # SmolLM2-135M
    (32, 8, 64),   # Llama-3.2-1B
    (6, 2, 128),   # head_dim 128 (Llama-3.2-3B's), fewer heads
]


@pytest.fixture(scope="module")
def lib():
    require_tool("g++")
    got = hn.library()
    assert got is not None, "the host attention kernel did not build"
    return got


def _inputs(rng, rows, window, heads, kv_heads, hd, scale=1.5):
    q = to_bf16(rng.standard_normal((rows, heads * hd)) * scale)
    k = to_bf16(rng.standard_normal((window, kv_heads * hd)) * scale)
    v = to_bf16(rng.standard_normal((window, kv_heads * hd)))
    return q, k, v


def _bits(a):
    return np.asarray(a).view(np.uint16)


@pytest.mark.parametrize("heads,kv_heads,hd", SHAPES)
@pytest.mark.parametrize("rows,pos,window", [(37, 0, 64), (130, 70, 256), (1, 255, 256)])
def test_agrees_with_the_numpy_path_within_bf16_rounding(lib, heads, kv_heads, hd, rows, pos, window):
    rng = np.random.default_rng(rows * hd + pos)
    q, k, v = _inputs(rng, rows, window, heads, kv_heads, hd)
    kw = dict(rows=rows, kv_rows=window, heads=heads, kv_heads=kv_heads, head_dim=hd)
    got = ref.attention(q, k, v, np.array([pos], np.int32), **kw).astype(np.float32)
    want = ref.attention_numpy(q, k, v, pos, **kw).astype(np.float32)
    assert got.shape == want.shape == (rows, heads * hd)
    rowmax = np.abs(want).reshape(rows, heads, hd).max(axis=2, keepdims=True)
    err = np.abs(got - want).reshape(rows, heads, hd)
    assert np.all(err <= 2.0 ** -7 * np.abs(want).reshape(rows, heads, hd) + 2.0 ** -10 * rowmax)
    assert np.mean(got != want) < 0.01     # differences are rare rounding flips, not a drift


def test_a_rows_bits_do_not_depend_on_the_chunk_or_decode(lib):
    heads, kv_heads, hd, window = 9, 3, 64, 320
    rng = np.random.default_rng(5)
    q, k, v = _inputs(rng, 300, window, heads, kv_heads, hd, scale=3.0)
    kw = dict(kv_rows=window, heads=heads, kv_heads=kv_heads, head_dim=hd)
    whole = ref.attention(q, k, v, 0, rows=300, **kw)
    for start, n in [(0, 17), (17, 64), (100, 199), (299, 1), (64, 4), (150, 3)]:
        part = ref.attention(q[start:start + n], k, v, start, rows=n, **kw)
        np.testing.assert_array_equal(_bits(part), _bits(whole[start:start + n]), err_msg=f"rows {start}+{n}")
    for p in (0, 1, 15, 16, 17, 299):
        one = ref.decode_attn(q[p:p + 1], k, v, np.array([p], np.int32), **kw)
        np.testing.assert_array_equal(_bits(one), _bits(whole[p:p + 1]), err_msg=f"decode at {p}")


def test_keys_past_the_query_never_matter(lib):
    """Window rows past the last query hold anything (here NaN and huge values): the result is unchanged."""
    heads, kv_heads, hd, rows, pos, window = 4, 2, 64, 20, 30, 96
    rng = np.random.default_rng(9)
    q, k, v = _inputs(rng, rows, window, heads, kv_heads, hd)
    kw = dict(rows=rows, kv_rows=window, heads=heads, kv_heads=kv_heads, head_dim=hd)
    a = ref.attention(q, k, v, pos, **kw)
    k2, v2 = k.astype(np.float32), v.astype(np.float32)
    k2[pos + rows:] = np.nan
    v2[pos + rows:] = 1e30
    b = ref.attention(q, k2, v2, pos, **kw)
    np.testing.assert_array_equal(_bits(a), _bits(b))


def test_thread_count_does_not_change_the_bits(lib, monkeypatch):
    heads, kv_heads, hd, rows, window = 9, 3, 64, 700, 1024     # above PARALLEL_MIN_WORK: the pool runs
    rng = np.random.default_rng(2)
    q, k, v = _inputs(rng, rows, window, heads, kv_heads, hd)
    assert rows * rows * heads >= ha.PARALLEL_MIN_WORK
    kw = dict(rows=rows, kv_rows=window, heads=heads, kv_heads=kv_heads, head_dim=hd)
    monkeypatch.setenv("LLAMA_NPU_EMU_THREADS", "1")
    one = ref.attention(q, k, v, 0, **kw)
    monkeypatch.setenv("LLAMA_NPU_EMU_THREADS", "3")
    three = ref.attention(q, k, v, 0, **kw)
    np.testing.assert_array_equal(_bits(one), _bits(three))
    monkeypatch.setenv("LLAMA_NPU_EMU_THREADS", "many")
    with pytest.raises(ValueError, match="LLAMA_NPU_EMU_THREADS='many' is not a number"):
        ref.attention(q, k, v, 0, **kw)


def test_vector_and_scalar_builds_give_identical_f32(lib, tmp_path):
    """The AVX2 path and the scalar path perform the same operations in the same order (before the bf16
    rounding, bit for bit)."""
    cxx = require_tool("g++")
    scalar = hn.bind(hn.build(cxx, tmp_path, ("-DLLAMA_NPU_SCALAR_ONLY",)))
    assert scalar.llama_npu_attention_vector_path() == 0
    rng = np.random.default_rng(3)
    heads, kv_heads, hd, rows, pos = 6, 2, 128, 45, 19
    q, k, v = _inputs(rng, rows, pos + rows, heads, kv_heads, hd, scale=4.0)
    kw = dict(rows=rows, heads=heads, kv_heads=kv_heads, head_dim=hd, scale=ref.attention_scale(hd))
    a = ha.run(lib, q.astype(np.float32), k, v, pos, **kw)
    b = ha.run(scalar, q.astype(np.float32), k, v, pos, **kw)
    np.testing.assert_array_equal(a.view(np.uint32), b.view(np.uint32))
    for bad in (np.nan, np.inf, -np.inf):          # non-finite scores take the same course in both paths
        kb = k.astype(np.float32)
        kb[11, 5] = bad
        a = ha.run(lib, q.astype(np.float32), kb, v, pos, **kw)
        b = ha.run(scalar, q.astype(np.float32), kb, v, pos, **kw)
        np.testing.assert_array_equal(a.view(np.uint32), b.view(np.uint32), err_msg=str(bad))
        assert np.isnan(a).any()
    if lib.llama_npu_attention_vector_path() == 0:
        pytest.skip("this machine's build is the scalar path: nothing else to compare")


def test_the_build_is_cached_and_keyed_by_its_flags(lib, tmp_path):
    cxx = require_tool("g++")
    first = hn.build(cxx, tmp_path)
    stamp = first.stat().st_mtime_ns
    assert hn.build(cxx, tmp_path) == first and first.stat().st_mtime_ns == stamp   # not rebuilt
    other = hn.build(cxx, tmp_path, ("-DLLAMA_NPU_SCALAR_ONLY",))
    assert other != first and other.exists()


def test_bad_shapes_are_refused_by_the_kernel(lib):
    fp = ctypes.POINTER(ctypes.c_float)
    buf = np.zeros(4096, dtype=np.float32)
    p = buf.ctypes.data_as(fp)
    ok = dict(rows=2, pos=0, heads=2, kv_heads=1, hd=16, npad=16, scale=0.25, h=0, r0=0, r1=2)

    def call(**over):
        a = {**ok, **over}
        return lib.llama_npu_attention(p, p, p, p, *(a[n] for n in ("rows", "pos", "heads", "kv_heads", "hd",
                                                                  "npad", "scale", "h", "r0", "r1")))
    assert call() == 0
    for bad in (dict(hd=24), dict(kv_heads=3), dict(npad=8), dict(pos=15), dict(h=1), dict(r1=3), dict(r0=2)):
        assert call(**bad) == -2, bad
    pack = lib.llama_npu_attention_pack
    assert pack(p, p, 2, 1, 16, 16, p, p) == 0
    for n, hd, npad in ((0, 16, 16), (17, 16, 16), (2, 24, 16), (2, 16, 24)):
        assert pack(p, p, n, 1, hd, npad, p, p) == -2, (n, hd, npad)


def test_without_a_compiler_the_numpy_path_runs_and_says_so(monkeypatch, capsys):
    monkeypatch.setattr(hn, "_state", {})
    monkeypatch.setattr(hn, "compiler", lambda: None)
    assert hn.library() is None
    assert "numpy paths: no C++ compiler" in capsys.readouterr().err
    rng = np.random.default_rng(4)
    q, k, v = _inputs(rng, 5, 8, 2, 1, 32)
    kw = dict(rows=5, kv_rows=8, heads=2, kv_heads=1, head_dim=32)
    np.testing.assert_array_equal(_bits(ref.attention(q, k, v, 3, **kw)),
                                  _bits(ref.attention_numpy(q, k, v, 3, **kw)))
    monkeypatch.setattr(hn, "_state", {})
    monkeypatch.setenv("LLAMA_NPU_HOST_KERNELS", "numpy")
    monkeypatch.setattr(hn, "compiler", lambda: pytest.fail("must not look for a compiler"))
    assert hn.library() is None
    assert capsys.readouterr().err == ""      # asked for: no notice


def test_a_compiler_that_fails_is_reported_with_its_error(tmp_path):
    fake = tmp_path / "fake-cxx"
    fake.write_text("#!/bin/sh\n[ \"$1\" = --version ] && { echo 'fake 1.0'; exit 0; }\n"
                    "echo 'gemv_host.cc:1: error: no such luck' >&2; exit 1\n")
    fake.chmod(0o755)
    with pytest.raises(hn.HostKernelsUnavailable, match="could not build attention_host.cc, gemv_bfp_host.cc, "
                                                        "gemv_host.cc, gemv_q4_host.cc: .*error: no such luck"):
        hn.build(str(fake), tmp_path / "out")
    assert not list((tmp_path / "out").glob("*.so"))     # no half-written library left behind


def test_a_forked_child_runs_pooled_work(lib):
    """After the pool has run, a fork()ed child (which has none of its threads) still gets its work done."""
    import multiprocessing as mp
    heads, kv_heads, hd, rows = 9, 3, 64, 700
    rng = np.random.default_rng(8)
    q, k, v = _inputs(rng, rows, rows, heads, kv_heads, hd)
    kw = dict(rows=rows, kv_rows=rows, heads=heads, kv_heads=kv_heads, head_dim=hd)
    want = ref.attention(q, k, v, 0, **kw)                   # the parent's pool has run
    with mp.get_context("fork").Pool(1) as pool:
        got = pool.apply_async(ref.attention, (q, k, v, 0), kw).get(timeout=120)
    np.testing.assert_array_equal(_bits(got), _bits(want))
