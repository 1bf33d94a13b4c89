"""The 4-bit weight format and the `gemv_q4` kernel: format round trips, RTN error bound, the C++ scalar path and
the AIE2P vector path (host aie_api, with the int4 ops) against the numpy reference, an off-by-one mutant that
fails, the builder on emu-interp and the hardware model at Llama shapes.

Tolerance of the kernel paths: both dequantize exactly as the reference (the same f32 ops, one bf16 RNE
rounding per weight), so only the accumulation order differs: 2^-7 |ref| + 2^-10 max|ref| (gemv's bound)."""
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
from kernel_builder.gemv_q4 import external as q4_ext
from kernel_builder.gemv_q4.format import Q4Layout, dequantize, pack, quantize_rtn, unpack
from kernel_builder.gemv_q4.plan import plan_gemv_q4
from kernel_builder.gemv_q4.reference import gemv_q4
from kernel_builder.instr_counts import Counts
from kernel_builder.numerics import BF16, to_bf16

VARIANTS = [(576, 32, 1, 4, 8), (256, 128, 1, 2, 4), (256, 32, 0, 3, 3)]   # (k, group, mins, tile_m, rows)


def _random_q4(rng, m, k, group, mins):
    lo, hi = (0, 16) if mins else (-8, 8)
    codes = rng.integers(lo, hi, size=(m, k))
    s = to_bf16(rng.uniform(0.01, 0.1, size=(m, k // group)).astype(np.float32))
    z = to_bf16(rng.uniform(-0.5, 0.0, size=(m, k // group)).astype(np.float32)) if mins else None
    return pack(codes, s, z, group), codes, s, z


def _close(got, want, what):
    g, w = np.asarray(got, np.float64), np.asarray(want, np.float64)
    bound = 2.0**-7 * np.abs(w) + 2.0**-10 * np.abs(w).max()
    err = np.abs(g - w)
    assert np.all(err <= bound), f"{what}: max err {err.max()} vs bound {bound.min()}"


# ------------------------------------------------------------------------------------------ format
@pytest.mark.parametrize("group,mins", [(32, True), (32, False), (128, True)])
def test_pack_unpack_round_trip(group, mins):
    rng = np.random.default_rng(1)
    k = 576 if group == 32 else 256
    p, codes, s, z = _random_q4(rng, 6, k, group, mins)
    lay = Q4Layout(k, group, mins)
    assert p.shape == (6, lay.row_bytes) and lay.row_bytes % 16 == 0
    c2, s2, z2 = unpack(p, k, group, mins)
    np.testing.assert_array_equal(c2, codes)
    np.testing.assert_array_equal(s2, s.astype(np.float32))
    if mins:
        np.testing.assert_array_equal(z2, z.astype(np.float32))
    # nibble order: element 0 in the low nibble of byte 0, element 1 in the high nibble
    assert p[0, 0] == (codes[0, 0] & 0xF) | ((codes[0, 1] & 0xF) << 4)
    want = codes.astype(np.float32).reshape(6, -1, group) * s.astype(np.float32)[:, :, None]
    if mins:
        want = want + z.astype(np.float32)[:, :, None]
    np.testing.assert_array_equal(dequantize(p, k, group, mins), to_bf16(want.reshape(6, k)))


def test_layout_sizes_and_bad_inputs():
    assert Q4Layout(576, 32, True).row_bytes == 368          # 288 + 36 + 36 = 360 -> 16-byte multiple
    assert Q4Layout(2048, 32, True).bits_per_weight() == 5.0
    assert Q4Layout(4096, 128, True).bits_per_weight() == 4.25
    with pytest.raises(ValueError, match="group size 64"):
        Q4Layout(256, 64, True)
    with pytest.raises(ValueError, match="multiple of the group size"):
        Q4Layout(100, 32, True)
    with pytest.raises(ValueError, match=r"codes outside \[-8, 7\]"):
        pack(np.full((1, 32), 8), np.ones((1, 1)), None, 32)


def test_rtn_error_is_within_half_a_step():
    rng = np.random.default_rng(2)
    w = to_bf16(rng.standard_normal((8, 256)).astype(np.float32))
    p = quantize_rtn(w, 32)
    _, s, _ = unpack(p, 256, 32, True)
    err = np.abs(dequantize(p, 256, 32, True).astype(np.float32) - w.astype(np.float32)).reshape(8, 8, 32)
    # half a quantization step, plus the bf16 roundings of min and of the dequantized weight
    bound = 0.5 * s[:, :, None] + 2.0**-8 * np.abs(w.astype(np.float32)).reshape(8, 8, 32).max(axis=2,
                                                                                               keepdims=True) * 2
    assert np.all(err <= bound)


# ------------------------------------------------------------------------------------------ kernel paths
@pytest.fixture(scope="module")
def scalar_lib(tmp_path_factory):
    cxx = require_tool("g++")
    out = tmp_path_factory.mktemp("q4_host")
    objs = []
    for v in VARIANTS:
        k = q4_ext.gemv_q4_kernel(*v)
        cmd = compile_rules.host_compile_command(k, out, cxx=cxx) + ["-Wall", "-Wextra"]
        res = subprocess.run(cmd, capture_output=True, text=True)
        assert res.returncode == 0 and "warning" not in res.stderr, res.stderr
        objs.append(out / compile_rules.host_object_name(k))
    so = out / "libq4.so"
    subprocess.run(compile_rules.host_link_command(objs, so, cxx=cxx), check=True)
    return ctypes.CDLL(str(so))


def _inputs(v, seed=5):
    k, group, mins, tm, rows = v
    rng = np.random.default_rng(seed)
    p, *_ = _random_q4(rng, rows, k, group, mins)
    x = to_bf16(rng.standard_normal(k).astype(np.float32))
    return p, x, gemv_q4(p, x, m=rows, k=k, group=group, mins=mins).reshape(-1)


@pytest.mark.parametrize("v", VARIANTS)
def test_scalar_path_matches_reference(scalar_lib, v):
    k, group, mins, tm, rows = v
    p, x, want = _inputs(v)
    y = np.zeros(rows, BF16)
    f = getattr(scalar_lib, q4_ext.gemv_q4_kernel(*v).symbol)
    f.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_int32]
    rb = Q4Layout(k, group, bool(mins)).row_bytes
    for r in range(0, rows, tm):
        blk = np.ascontiguousarray(p[r:r + tm])
        f(blk.ctypes.data, x.ctypes.data, y.ctypes.data, r)
    assert blk.nbytes == tm * rb
    _close(y, want, "scalar")


def _vector_run(v, lib=None, seed=5):
    k, group, mins, tm, rows = v
    kern = q4_ext.gemv_q4_kernel(*v)
    lib = lib or aie_host.load(kern)
    p, x, want = _inputs(v, seed)
    xa, y = aie_host.aligned(x), aie_host.aligned(np.zeros(rows, BF16))
    counts = {}
    for r in range(0, rows, tm):
        counts = lib.call(kern.symbol, aie_host.aligned(np.ascontiguousarray(p[r:r + tm])), xa, y, r)
    return y, want, counts


@pytest.mark.parametrize("v", VARIANTS)
def test_vector_path_matches_reference(v):
    y, want, counts = _vector_run(v)
    _close(y, want, "vector")
    k, group, mins, tm, _ = v
    assert counts["unpack"] == tm * k // 32                                            # one per 32 lanes
    assert counts["vmac_bf16"] == 2 * tm * k // 32                                     # d*q, then the mac
    assert counts["vload_bytes"] == tm * (k // 2 + 2 * k)                              # codes + x, nothing else
    # the cost descriptor's counted formula gives exactly the host's counts of one call
    kern = q4_ext.gemv_q4_kernel(*v)
    cost = q4_ext.COSTS[0]
    formula = cost.work(cost.pattern.fullmatch(kern.symbol), []).counts
    assert Counts._of(formula).host() == {k2: n for k2, n in counts.items() if n}


def test_off_by_one_in_the_vector_path_fails(tmp_path):
    v = VARIANTS[0]
    text = (SOURCE_DIR / "gemv_q4.cc").read_text()
    mutated, n = re.subn(r"g < kGroups; \+\+g\) \{", "g < kGroups - 1; ++g) {", text)
    assert n == 1
    src = tmp_path / "gemv_q4.cc"
    src.write_text(mutated)
    y, want, _ = _vector_run(v, aie_host.load(q4_ext.gemv_q4_kernel(*v), source=src))
    with pytest.raises(AssertionError):
        _close(y, want, "mutant")


def test_misaligned_codes_fail():
    v = VARIANTS[0]
    kern = q4_ext.gemv_q4_kernel(*v)
    p, x, _ = _inputs(v)
    with pytest.raises(aie_host.AieHostError, match=r"misaligned load_v of 32 x int4 .*16-byte alignment"):
        aie_host.load(kern).call(kern.symbol, aie_host.aligned(np.ascontiguousarray(p[:4]), offset=8),
                                 aie_host.aligned(x), aie_host.aligned(np.zeros(8, BF16)), 0)


def test_int4_vector_sizes_are_checked(tmp_path):
    src = tmp_path / "bad.cc"
    src.write_text('#include "kernel_common.h"\nvoid f(const int4 *p) { auto v = ::aie::load_v<16>(p); (void)v; }\n')
    assert "AIE2P int4 vectors have 32, 64 or 128 lanes" in aie_host.compile_errors(None, src)


# ------------------------------------------------------------------------------------------ plan / hw
def test_plan_streams_whole_rows_at_llama_shapes():
    for m, k in ((2048, 2048), (8192, 2048), (2048, 8192), (14336, 4096), (4096, 14336), (1536, 576)):
        p = plan_gemv_q4(m, k, 32, 1)
        assert p.tiles == 16 or m // p.tiles % 2 == 0
        assert p.stream_bytes() < 2 * k + p.rows_per_tile * k    # < the bf16 gemv's per-tile stream bytes / 1.5
    with pytest.raises(ValueError, match="k=100 must be a multiple of 32"):
        plan_gemv_q4(64, 100, 32, 1)


@pytest.mark.parametrize("m,k,group,mins", [(64, 576, 32, 1), (32, 256, 128, 1), (48, 256, 32, 0)])
def test_builder_on_the_interpreter(m, k, group, mins):
    """The module text itself (emu-interp): every tile gets x and its rows, calls the kernel's numpy model
    per step and stores its outputs once; y equals the reference."""
    from multi_launch_builder.emulator import air_interp
    from kernel_builder.registry import kernel_text
    rng = np.random.default_rng(9)
    p, *_ = _random_q4(rng, m, k, group, mins)
    x = to_bf16(rng.standard_normal((1, k)).astype(np.float32))
    y = np.zeros((1, m), BF16)
    plan = plan_gemv_q4(m, k, group, mins)
    stats = air_interp.compile_module(kernel_text("gemv_q4", m, k, group, mins)).run([p.view(np.int8), x, y])
    assert stats.tiles == plan.tiles
    assert stats.dma_bytes == 2 * m                                   # the one store per tile
    want = gemv_q4(p, x, m=m, k=k, group=group, mins=mins)
    _close(y, want, "interp")


@pytest.mark.parametrize("m,k", [(2048, 2048), (8192, 2048), (2048, 8192), (512, 2048), (4096, 4096),
                                 (14336, 4096), (4096, 14336), (576, 576), (1536, 576)])
def test_hardware_model_accepts_llama_shapes(m, k):
    from kernel_builder.hw import analyze_module
    from kernel_builder.registry import kernel_text
    rep = analyze_module(kernel_text("gemv_q4", m, k, 32, 1))
    assert rep.ok, rep.first_violation()


def test_q4_memory_figures():
    """benchmarks/q4.py's memory row: Llama-3.1-8B q4 (group 32 with mins) weights + 8k KV cache fit 6 GiB."""
    from benchmarks.q4 import kv_bytes, q4_weight_bytes
    from llama_npu.models.llama import LLAMA31_8B, LLAMA32_1B
    w8 = q4_weight_bytes(LLAMA31_8B, 32, True, tied=False)
    assert 4.5 * 2**30 < w8 < 4.8 * 2**30
    assert w8 + kv_bytes(LLAMA31_8B, 8192) <= 6 * 2**30
    assert q4_weight_bytes(LLAMA32_1B, 32, True, tied=True) < 0.75 * 2**30


def test_host_q4_gemv_equals_host_bf16_gemv_on_dequantized_weights():
    """The emulator's q4 GEMV (host C++) gives the bits of the bf16 host GEMV on the dequantized weights."""
    from external_kernels import host_build
    from kernel_builder.gemv.reference import gemv
    if host_build.library() is None:
        pytest.skip("no host kernels")
    rng = np.random.default_rng(11)
    for m, k, group, mins in ((64, 576, 32, 1), (40, 256, 128, 1), (32, 256, 32, 0)):
        p, *_ = _random_q4(rng, m, k, group, mins)
        x = to_bf16(rng.standard_normal(k).astype(np.float32))
        got = gemv_q4(p, x, m=m, k=k, group=group, mins=mins)
        np.testing.assert_array_equal(got, gemv(dequantize(p, k, group, bool(mins)), x, m=m, k=k))


# ------------------------------------------------------------------------------------------ 8-bit codes (Q8_0)
Q8 = (576, 32, 0, 4, 8, 8)       # (k, group, mins, tile_m, rows, bits): GGUF Q8_0 rows of SmolLM2's vocabulary


def _random_q8(rng, m, k):
    codes = rng.integers(-128, 128, size=(m, k))
    s = to_bf16(rng.uniform(0.001, 0.01, size=(m, k // 32)).astype(np.float32))
    return pack(codes, s, None, 32, bits=8), codes, s


def test_q8_layout_round_trip():
    p, codes, s = _random_q8(np.random.default_rng(12), 3, 576)
    assert p.shape == (3, 640) and Q4Layout(576, 32, False, 8).bits_per_weight() == 8 * 640 / 576   # 576 + 36, padded to 32
    np.testing.assert_array_equal(unpack(p, 576, 32, False, 8)[0], codes)
    want = codes.astype(np.float32).reshape(3, -1, 32) * s.astype(np.float32)[:, :, None]
    np.testing.assert_array_equal(dequantize(p, 576, 32, False, 8), to_bf16(want.reshape(3, 576)))


def test_q8_scalar_and_vector_paths_match_reference(tmp_path):
    k, group, mins, tm, rows, bits = Q8
    kern = q4_ext.gemv_q4_kernel(*Q8)
    assert kern.symbol.endswith("_b8") and ("Q4_BITS", "8") in kern.defines
    rng = np.random.default_rng(13)
    p, *_ = _random_q8(rng, rows, k)
    x = to_bf16(rng.standard_normal(k).astype(np.float32))
    want = gemv_q4(p, x, m=rows, k=k, group=group, mins=mins, bits=8).reshape(-1)
    cxx = require_tool("g++")
    cmd = compile_rules.host_compile_command(kern, tmp_path, cxx=cxx) + ["-Wall", "-Wextra"]
    res = subprocess.run(cmd, capture_output=True, text=True)
    assert res.returncode == 0 and "warning" not in res.stderr, res.stderr
    so = tmp_path / "libq8.so"
    subprocess.run(compile_rules.host_link_command([tmp_path / compile_rules.host_object_name(kern)], so, cxx=cxx),
                   check=True)
    f = getattr(ctypes.CDLL(str(so)), kern.symbol)
    f.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_int32]
    y = np.zeros(rows, BF16)
    for r in range(0, rows, tm):
        blk = np.ascontiguousarray(p[r:r + tm])
        f(blk.ctypes.data, x.ctypes.data, y.ctypes.data, r)
    _close(y, want, "q8 scalar")
    lib = aie_host.load(kern)
    xa, yv = aie_host.aligned(x), aie_host.aligned(np.zeros(rows, BF16))
    for r in range(0, rows, tm):
        counts = lib.call(kern.symbol, aie_host.aligned(np.ascontiguousarray(p[r:r + tm])), xa, yv, r)
    _close(yv, want, "q8 vector")
    assert counts.get("unpack", 0) == 0 and counts["vload_bytes"] == tm * (k + 2 * k)
    cost = q4_ext.COSTS[0]
    formula = cost.work(cost.pattern.fullmatch(kern.symbol), []).counts
    assert Counts._of(formula).host() == {k2: n for k2, n in counts.items() if n}


def test_q8_builder_on_the_interpreter_and_hardware_model():
    from kernel_builder.hw import analyze_module
    from multi_launch_builder.emulator import air_interp
    from kernel_builder.registry import kernel_text
    rng = np.random.default_rng(14)
    p, *_ = _random_q8(rng, 64, 576)
    x = to_bf16(rng.standard_normal((1, 576)).astype(np.float32))
    y = np.zeros((1, 64), BF16)
    text = kernel_text("gemv_q4", 64, 576, 32, 0, 8)
    air_interp.compile_module(text).run([p.view(np.int8), x, y])
    _close(y, gemv_q4(p, x, m=64, k=576, group=32, mins=0, bits=8), "q8 interp")
    for m, k in ((6144, 576), (16384, 2048), (16384, 4096)):      # LM-head partitions: SmolLM2, Llama 1B / 8B
        rep = analyze_module(kernel_text("gemv_q4", m, k, 32, 0, 8))
        assert rep.ok, rep.first_violation()


def test_host_q8_gemv_equals_host_bf16_gemv_on_dequantized_weights():
    """The emulator's 8-bit GEMV (host C++, llama_npu_gemv_q8) gives the bits of the bf16 host GEMV on the
    dequantized rows (the LM head of a Q8_0 GGUF, per token)."""
    from external_kernels import host_build
    from kernel_builder.gemv.reference import gemv
    if host_build.library() is None:
        pytest.skip("no host kernels")
    rng = np.random.default_rng(15)
    p, *_ = _random_q8(rng, 96, 576)
    x = to_bf16(rng.standard_normal(576).astype(np.float32))
    got = gemv_q4(p, x, m=96, k=576, group=32, mins=0, bits=8)
    np.testing.assert_array_equal(got, gemv(dequantize(p, 576, 32, False, 8), x, m=96, k=576))


def test_host_q4_and_q8_paths_give_identical_bits(tmp_path):
    """The emulator's host GEMV builds (AVX-512 table lookup where the CPU has it, AVX2, scalar) give the same f32
    bits for 4-bit (both code kinds, group 32 and 128) and 8-bit codes, also on row ranges of a call."""
    from external_kernels import host_build as hn
    native = hn.library()
    if native is None:
        pytest.skip("no host kernels")
    cxx = require_tool("g++")
    builds = {"native": native,
              "avx2": hn.bind(hn.build(cxx, tmp_path / "avx2", ("-DLLAMA_NPU_NO_AVX512",))),
              "scalar": hn.bind(hn.build(cxx, tmp_path / "scalar", ("-DLLAMA_NPU_SCALAR_ONLY",)))}
    rng = np.random.default_rng(16)
    cases = [(37, 576, 32, 1, 4), (20, 512, 128, 1, 4), (9, 256, 32, 0, 4), (11, 576, 32, 0, 8)]
    for m, k, group, mins, bits in cases:
        if bits == 8:
            p, *_ = _random_q8(rng, m, k)
        else:
            p, *_ = _random_q4(rng, m, k, group, mins)
        x = rng.standard_normal(k).astype(np.float32)
        rb = Q4Layout(k, group, bool(mins), bits).row_bytes
        got = {}
        for name, lib in builds.items():
            fn = lib.llama_npu_gemv_q8 if bits == 8 else lib.llama_npu_gemv_q4
            y = np.full(m, np.nan, np.float32)
            for r0, r1 in ((0, 5), (5, m)):
                assert fn(p.ctypes.data, x.ctypes.data, y.ctypes.data, m, k, group, mins, rb, r0, r1) == 0
            got[name] = y.view(np.uint32)
        for name in ("avx2", "scalar"):
            np.testing.assert_array_equal(got["native"], got[name], err_msg=f"{name} {m}x{k} g{group} z{mins} b{bits}")
