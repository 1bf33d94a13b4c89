"""The external C++ kernels (scalar host path) against kernel_builder.reference, plus the compile rules.

The AIE2P vector path needs Peano and cannot be built here; the host build compiles the same sources with
the same -D shape flags and renamed symbols, so the kernel contracts (layouts, masks, offsets, rounding) are
checked for real. One shared library holds every variant (built once per session, in parallel).

Tolerances: RoPE and add are the same f32 operations as the reference -> compared bit for bit. GEMV/GEMM
accumulate in a different order than numpy's BLAS: |c - ref| <=
2^-7 |ref| + 2^-10 max|ref| (two bf16 ulps at the element, plus slack for cancellation); the chunked GEMV
(partial sums carried in f32 across K chunks) equals the unchunked one bit for bit. RMSNorm sums squares
sequentially and multiplies by 1/group (numpy: pairwise sum, division): within one bf16 ulp. SwiGLU uses expf
vs numpy's exp: at most 1 bf16 ulp apart, and nearly always equal. The attention primitives:
tests/test_attention_cpp.py.
"""
from __future__ import annotations

import ctypes
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from tooling import require_tool

from external_kernels import compile_rules
from kernel_builder import externals as ext, reference as ref
from kernel_builder.add import external as add_ext
from kernel_builder.attention import external as attention_ext
from kernel_builder.gemm import external as gemm_ext
from kernel_builder.gemv import external as gemv_ext
from kernel_builder.numerics import BF16, to_bf16
from kernel_builder.rmsnorm import external as rmsnorm_ext
from kernel_builder.rope import external as rope_ext
from kernel_builder.swiglu import external as swiglu_ext
from kernel_builder.gemm_swiglu.layout import split
from llama_npu.rope import rope_lut

GEMV_VARIANTS = [(576, 576, 12, 24), (2048, 2048, 4, 8), (8192, 4096, 2, 4), (8192, 512, 16, 32),
                 (8192, 8192, 2, 4), (8192, 4096, 1, 4), (8192, 8192, 1, 2)]  # (k, kc, tile_m, rows per tile)
ROPE_VARIANTS = [(64, 5, 1), (128, 3, 2), (64, 9, 4)]  # (head_dim, heads, rows)
RMSNORM_VARIANTS = [(576, 1), (2048, 2), (64, 9)]     # (group, units)
SWIGLU_N = 256
ADD_N = 288
GEMM_VARIANTS = [(8, 64, 48), (64, 64, 64), (16, 32, 128)]  # tile_m, tile_k, tile_n
LLAMA3_SCALING = {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                  "original_max_position_embeddings": 8192}


def _all_kernels() -> list[compile_rules.ExternalKernel]:
    ks = [gemv_ext.gemv_kernel(*v) for v in GEMV_VARIANTS]
    ks += [rope_ext.rope_kernel(*v) for v in ROPE_VARIANTS]
    ks += [rmsnorm_ext.rmsnorm_kernel(*v) for v in RMSNORM_VARIANTS]
    ks.append(swiglu_ext.swiglu_kernel(SWIGLU_N))
    ks.append(add_ext.add_kernel(ADD_N))
    ks.append(attention_ext.attention_prefill_kernels(64, 64, 32).init)  # one object holds init/item/finish
    ks.append(attention_ext.attention_decode_kernels(64, 4, 32, 4).init)  # one object holds init/step/merge
    ks += [gemm_ext.gemm_kernels(*v).zero for v in GEMM_VARIANTS]  # one object holds zero/mac/out
    return ks


@pytest.fixture(scope="session")
def lib(tmp_path_factory) -> ctypes.CDLL:
    cxx = require_tool("g++")
    out = tmp_path_factory.mktemp("externals_host")
    cmds = [compile_rules.host_compile_command(k, out, cxx=cxx) + ["-Wall", "-Wextra"] for k in _all_kernels()]
    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(lambda c: subprocess.run(c, capture_output=True, text=True), cmds))
    for cmd, res in zip(cmds, results):
        assert res.returncode == 0, f"{' '.join(cmd)}\n{res.stderr}"
        assert "warning" not in res.stderr, res.stderr
    objects = [out / compile_rules.host_object_name(k) for k in _all_kernels()]
    so = out / "libllama_npu_kernels.so"
    subprocess.run(compile_rules.host_link_command(objects, so, cxx=cxx), check=True)
    return ctypes.CDLL(str(so))


def ptr(a: np.ndarray) -> ctypes.c_void_p:
    assert a.flags.c_contiguous
    return a.ctypes.data_as(ctypes.c_void_p)


def fn(lib, symbol: str, n_ptrs: int, n_ints: int = 0, n_floats: int = 0):
    f = getattr(lib, symbol)
    f.argtypes = [ctypes.c_void_p] * n_ptrs + [ctypes.c_int32] * n_ints + [ctypes.c_float] * n_floats
    f.restype = None
    return f


def rand_bf16(rng, shape, scale=1.0) -> np.ndarray:
    return to_bf16(rng.standard_normal(shape).astype(np.float32) * np.float32(scale))


def assert_close(got, want, what):
    got64, want64 = got.astype(np.float64), want.astype(np.float64)
    bound = 2.0**-7 * np.abs(want64) + 2.0**-10 * np.abs(want64).max()
    err = np.abs(got64 - want64)
    assert np.all(err <= bound), f"{what}: max err {err.max()} (bound at worst {bound[np.argmax(err - bound)]})"


@pytest.fixture
def rng():
    return np.random.default_rng(7)


# ------------------------------------------------------------------------------------------ GEMV

def _gemv_tile(lib, k, kc, tm, rows, w, x):
    """Drive one tile the way the builder does: the whole x in one buffer, row blocks of tm rows, K chunks of kc
    (the kernel reads x at k0), one y buffer."""
    f = fn(lib, gemv_ext.gemv_kernel(k, kc, tm, rows).symbol, 4, 2)
    acc = np.full(tm, np.nan, np.float32)  # uninitialised: the first chunk must not read it
    y = np.zeros(rows, dtype=BF16)
    xs = np.ascontiguousarray(x)
    for r in range(0, rows, tm):
        for k0 in range(0, k, kc):
            block = np.ascontiguousarray(w[r:r + tm, k0:k0 + kc])
            f(ptr(block), ptr(xs), ptr(acc), ptr(y), r, k0)
    return y


@pytest.mark.parametrize("k,kc,tile_m,rows", GEMV_VARIANTS)
def test_gemv_tiles_match_reference(lib, rng, k, kc, tile_m, rows):
    w = rand_bf16(rng, (rows, k), 0.03)
    x = rand_bf16(rng, (k,))
    y = _gemv_tile(lib, k, kc, tile_m, rows, w, x)
    what = gemv_ext.gemv_kernel(k, kc, tile_m, rows).symbol
    assert_close(y, ref.gemv(w, x, m=rows, k=k).reshape(-1), what)
    assert_close(y, to_bf16(w.astype(np.float64) @ x.astype(np.float64)), what + " vs f64")


def test_gemv_k_chunks_continue_one_f32_sum(lib, rng):
    """Partial sums carried across K chunks: the chunked kernel equals the whole-row one bit for bit, a
    middle chunk leaves y alone (only the last chunk of a row block writes it), and a chunk reads the whole x
    at its k0."""
    k = 8192
    w, x = rand_bf16(rng, (4, k), 0.03), rand_bf16(rng, (k,))
    whole = _gemv_tile(lib, k, k, 2, 4, w, x)
    chunked = _gemv_tile(lib, k, 4096, 2, 4, w, x)
    np.testing.assert_array_equal(whole.view(np.uint16), chunked.view(np.uint16))
    f = fn(lib, gemv_ext.gemv_kernel(k, 4096, 2, 4).symbol, 4, 2)
    acc, y = np.zeros(2, np.float32), np.full(4, 7.0, BF16)
    f(ptr(np.ascontiguousarray(w[2:4, :4096])), ptr(np.ascontiguousarray(x)), ptr(acc), ptr(y), 2, 0)
    np.testing.assert_array_equal(y.astype(np.float32), 7.0)
    assert np.all(acc != 0)
    # the last chunk reads x at k0 (the second half), not at 0: the sum equals the reference's
    f(ptr(np.ascontiguousarray(w[2:4, 4096:])), ptr(np.ascontiguousarray(x)), ptr(acc), ptr(y), 2, 4096)
    np.testing.assert_array_equal(y[2:4].view(np.uint16), whole[2:4].view(np.uint16))


def test_gemv_variants_coexist_in_one_library(lib):
    symbols = {gemv_ext.gemv_kernel(*v).symbol for v in GEMV_VARIANTS}
    assert len(symbols) == len(GEMV_VARIANTS)
    for sym in symbols:
        assert hasattr(lib, sym)


# ------------------------------------------------------------------------------------------ RoPE

@pytest.mark.parametrize("head_dim,heads,rows", ROPE_VARIANTS)
def test_rope_blocks_bit_exact_vs_reference_up_to_131072(lib, rng, head_dim, heads, rows):
    f = fn(lib, rope_ext.rope_kernel(head_dim, heads, rows).symbol, 3)
    positions = np.array([0, 1, 5, 1000, 8191, 8192, 65536, 131000, 131071, 131072, 7, 3])
    n = len(positions) // rows * rows
    lut = rope_lut(positions[:n], head_dim, 500000.0, LLAMA3_SCALING)
    x = rand_bf16(rng, (n, heads * head_dim), 2.0)
    y = np.zeros_like(x)
    for r in range(0, n, rows):  # `rows` position rows per call, each with its own LUT row
        out = np.zeros((rows, heads * head_dim), dtype=BF16)
        f(ptr(np.ascontiguousarray(x[r:r + rows])), ptr(np.ascontiguousarray(lut[r:r + rows])), ptr(out))
        y[r:r + rows] = out
    want = ref.rope(x, lut, rows=n, heads=heads, head_dim=head_dim)
    np.testing.assert_array_equal(y.view(np.uint16), want.view(np.uint16))


# ------------------------------------------------------------------------------------------ RMSNorm, add

@pytest.mark.parametrize("group,units", RMSNORM_VARIANTS)
def test_rmsnorm_units_match_reference_within_one_ulp(lib, rng, group, units):
    f = fn(lib, rmsnorm_ext.rmsnorm_kernel(group, units).symbol, 3, 0, 1)
    x = rand_bf16(rng, (units, group), 3.0)
    x[0, :] = to_bf16(np.float32(1e-3) * rng.standard_normal(group).astype(np.float32))  # eps matters here
    w = rand_bf16(rng, (group,))
    y = np.zeros_like(x)
    f(ptr(x), ptr(w), ptr(y), 1e-5)
    want = ref.rmsnorm(x, w, rows=units, dim=group, eps=1e-5)
    ulps = np.abs(y.view(np.int16).astype(np.int32) - want.view(np.int16).astype(np.int32))
    assert ulps.max() <= 1 and np.mean(ulps == 0) > 0.97, f"max ulp diff {ulps.max()}"
    # grouped use: `units` heads of one row with one [group] weight = the reference's per-head q/k norm
    want_g = ref.rmsnorm(x.reshape(1, -1), w, rows=1, dim=units * group, eps=1e-5, group=group).reshape(units, group)
    np.testing.assert_array_equal(want.view(np.uint16), want_g.view(np.uint16))


def test_add_bit_exact(lib, rng):
    f = fn(lib, add_ext.add_kernel(ADD_N).symbol, 3)
    a, b = rand_bf16(rng, (ADD_N,), 100.0), rand_bf16(rng, (ADD_N,))
    b[:3] = -a[:3]  # exact cancellation -> +0
    y = np.zeros(ADD_N, BF16)
    f(ptr(a), ptr(b), ptr(y))
    want = ref.add(a, b, rows=1, dim=ADD_N).reshape(-1)
    np.testing.assert_array_equal(y.view(np.uint16), want.view(np.uint16))


# ------------------------------------------------------------------------------------------ SwiGLU

def test_swiglu_matches_reference_within_one_ulp(lib, rng):
    kern = swiglu_ext.swiglu_kernel(SWIGLU_N)
    f = fn(lib, kern.symbol, 3)
    g, u = rand_bf16(rng, (SWIGLU_N,), 4.0), rand_bf16(rng, (SWIGLU_N,))
    g[:4] = to_bf16(np.array([-200.0, -30.0, 0.0, 90.0], dtype=np.float32))
    y = np.zeros(SWIGLU_N, dtype=BF16)
    f(ptr(g), ptr(u), ptr(y))
    want = ref.swiglu(g, u, rows=1, dim=SWIGLU_N).reshape(-1)
    ulps = np.abs(y.view(np.uint16).astype(np.int32) - want.view(np.uint16).astype(np.int32))
    same_sign = np.signbit(y.astype(np.float32)) == np.signbit(want.astype(np.float32))
    zeros = (y.astype(np.float32) == 0) & (want.astype(np.float32) == 0)
    assert np.all((ulps <= 1) & same_sign | zeros), f"max ulp diff {ulps.max()}"
    assert np.mean(ulps == 0) > 0.97


# ------------------------------------------------------------------------------------------ GEMM

def _block(x: np.ndarray) -> np.ndarray:
    """[rows, cols] -> the micro-kernel's 8x8-blocked layout [rows/8][cols/8][8][8] (flat, contiguous)."""
    r, c = x.shape
    return np.ascontiguousarray(x.reshape(r // 8, 8, c // 8, 8).transpose(0, 2, 1, 3).reshape(-1))


def _unblock(x: np.ndarray, r: int, c: int) -> np.ndarray:
    return x.reshape(r // 8, c // 8, 8, 8).transpose(0, 2, 1, 3).reshape(r, c)


@pytest.mark.parametrize("tm,tk,tn", GEMM_VARIANTS)
def test_gemm_micro_kernel_matches_reference_and_its_numpy_model(lib, rng, tm, tk, tn):
    """zero, one mac per K step on 8x8-blocked tiles (w in the HF [n, k] layout), then each in-place epilogue (out,
    glu, bias) on a copy of the accumulator (2*tm*tn bf16 = the f32 bytes): the references within 2 bf16 ulps,
    and the interpreter's numpy model (kernel_builder.external_models) bit for bit at every step."""
    from kernel_builder.externals import external_model
    from multi_launch_builder.emulator.air_interp import MemRef
    ks = gemm_ext.gemm_kernels(tm, tk, tn)
    zero, mac = fn(lib, ks.zero.symbol, 1), fn(lib, ks.mac.symbol, 4)
    models = {part: external_model(getattr(ks, part).symbol) for part in ("zero", "mac", "out", "glu", "bias")}
    scratch = np.zeros(gemm_ext.scratch_elems(tm, tk), BF16)
    mscratch = MemRef(scratch.copy(), scratch.shape, "bf16")
    steps = 3
    a, w = rand_bf16(rng, (tm, steps * tk)), rand_bf16(rng, (tn, steps * tk), 0.1)
    acc = np.full(2 * tm * tn, np.nan, BF16)
    macc = MemRef(np.full(2 * tm * tn, np.nan, BF16), (2 * tm * tn,), "bf16")
    zero(ptr(acc))
    models["zero"](macc)
    for s in range(steps):
        at, wt = _block(a[:, s * tk:(s + 1) * tk]), _block(w[:, s * tk:(s + 1) * tk])
        mac(ptr(at), ptr(wt), ptr(acc), ptr(scratch))
        models["mac"](MemRef(at.copy(), at.shape, "bf16"), MemRef(wt.copy(), wt.shape, "bf16"), macc, mscratch)
        np.testing.assert_array_equal(acc.view(np.uint16), macc.data.view(np.uint16))
    want = ref.gemm(a, w, m=tm, k=steps * tk, n=tn)
    b = rand_bf16(rng, (1, tn))
    h = tn // 2
    cases = (("out", [], tm * tn, tn, want),
             ("glu", [], tm * tn // 2, h, ref.swiglu(*(x.T for x in split(want.T)), rows=tm, dim=h)),
             ("bias", [b.reshape(-1)], tm * tn, tn, ref.KERNELS["gemm_bias"](a, w, b, m=tm, k=steps * tk, n=tn)))
    for part, extra, size, cols, expect in cases:
        c, mc = acc.copy(), MemRef(macc.data.copy(), macc.data.shape, "bf16")
        fn(lib, getattr(ks, part).symbol, 1 + len(extra))(ptr(c), *(ptr(e) for e in extra))
        models[part](mc, *(MemRef(e.copy(), e.shape, "bf16") for e in extra))
        np.testing.assert_array_equal(c[:size].view(np.uint16), mc.data[:size].view(np.uint16))
        got = _unblock(c[:size], tm, cols)
        assert_close(got, expect, getattr(ks, part).symbol)
    got = _unblock(_epilogue(lib, ks, acc, "out"), tm, tn)
    assert_close(got, to_bf16(a.astype(np.float64) @ w.astype(np.float64).T), ks.mac.symbol + " vs f64")


def _epilogue(lib, ks, acc, part):
    c = acc.copy()
    fn(lib, getattr(ks, part).symbol, 1)(ptr(c))
    return c[:c.size // 2]


def test_gemm_micro_kernel_reads_w_rows_as_output_columns(lib):
    """w row j only feeds output column j: a unit w row picks one column of a (catches a kernel that reads
    w as [k, n] or swaps the block order)."""
    tm, tk, tn = GEMM_VARIANTS[0]
    ks = gemm_ext.gemm_kernels(tm, tk, tn)
    zero, mac = fn(lib, ks.zero.symbol, 1), fn(lib, ks.mac.symbol, 4)
    a = to_bf16(np.arange(tm * tk, dtype=np.float32).reshape(tm, tk) / 64)
    w = np.zeros((tn, tk), BF16)
    for j in range(tn):
        w[j, (5 * j) % tk] = 1.0
    acc = np.zeros(2 * tm * tn, BF16)
    zero(ptr(acc))
    mac(ptr(_block(a)), ptr(_block(w)), ptr(acc), ptr(np.zeros(gemm_ext.scratch_elems(tm, tk), BF16)))
    c = _epilogue(lib, ks, acc, "out")
    want = np.stack([a[:, (5 * j) % tk] for j in range(tn)], axis=1)
    np.testing.assert_array_equal(_unblock(c, tm, tn).view(np.uint16), want.view(np.uint16))


# ------------------------------------------------------------------------------------------ compile rules

def test_peano_compile_command_flags(tmp_path):
    kern = gemv_ext.gemv_kernel(8192, 4096, 2, 256)
    cmd = compile_rules.compile_command(kern, tmp_path / "out", Path("/opt/peano"), aie_include_dir=Path("/opt/aie/include"))
    assert cmd[0] == "/opt/peano/bin/clang++"
    for flag in ("--target=aie2p-none-unknown-elf", "-O2", "-std=c++20", "-D__AIE_API_AIE_ADF_HPP__",
                 "-I/opt/aie/include", "-DGEMV_K=8192", "-DGEMV_KC=4096", "-DGEMV_TILE_M=2", "-DGEMV_ROWS=256",
                 "-DGEMV_SYMBOL=mv_bf16_k8192_c4096_m2_r256"):
        assert flag in cmd, flag
    assert cmd[cmd.index("-c") + 1].endswith("external_kernels/gemv.cc")
    assert cmd[cmd.index("-o") + 1] == str(tmp_path / "out" / "mv_k8192_c4096_m2_r256.o")
    assert Path(cmd[cmd.index("-c") + 1]).is_file()


def test_peano_include_dir_defaults_to_mlir_aie_install(tmp_path, monkeypatch):
    monkeypatch.setenv("MLIR_AIE_INSTALL_DIR", "/opt/mlir-aie")
    cmd = compile_rules.compile_command(rope_ext.rope_kernel(64, 8), tmp_path, Path("/p"))
    assert "-I/opt/mlir-aie/include" in cmd
    monkeypatch.delenv("MLIR_AIE_INSTALL_DIR")
    assert not any(f.startswith("-I/opt") for f in compile_rules.compile_command(rope_ext.rope_kernel(64, 8), tmp_path, Path("/p")))


def test_host_compile_command_builds_scalar_path(tmp_path):
    ks = attention_ext.attention_prefill_kernels(128, 64, 32)
    cmd = compile_rules.host_compile_command(ks.update, tmp_path, cxx="c++")
    assert cmd[0] == "c++" and "-std=c++20" in cmd and "-fPIC" in cmd
    assert not any("target" in f for f in cmd)
    assert cmd[cmd.index("-o") + 1] == str(tmp_path / "attnp_hd128_q64_k32.host.o")
    for d in ("-DATTN_MODE=1", "-DATTN_HEAD_DIM=128", "-DATTN_LQ=64", "-DATTN_LK=32",
              "-DATTN_UPDATE_SYMBOL=attnp_item_bf16_hd128_q64_k32", f"-DATTN_SCALE={float.hex(ref.attention_scale(128))}f"):
        assert d in cmd, d


def test_registry_names_and_validation():
    k = gemv_ext.gemv_kernel(2048, 2048, 4, 256)
    assert (k.symbol, k.obj, k.source) == ("mv_bf16_k2048_c2048_m4_r256", "mv_k2048_c2048_m4_r256.o", "gemv.cc")
    r, s = rope_ext.rope_kernel(64, 32, 2), swiglu_ext.swiglu_kernel(2048)
    assert (r.symbol, r.obj, s.symbol, s.obj) == ("rope_bf16_hd64_h32_r2", "rope_hd64_h32_r2.o", "swiglu_bf16_n2048",
                                                  "swiglu_n2048.o")
    n, a = rmsnorm_ext.rmsnorm_kernel(64, 4), add_ext.add_kernel(4096)
    assert (n.symbol, n.obj, a.symbol, a.obj) == ("rmsnorm_bf16_g64_u4", "rmsnorm_g64_u4.o", "add_bf16_n4096",
                                                  "add_n4096.o")
    init, item, finish = attention_ext.attention_prefill_kernels(64, 64, 32)
    assert init.obj == item.obj == finish.obj == "attnp_hd64_q64_k32.o"
    assert len({init.symbol, item.symbol, finish.symbol}) == 3
    init, step, merge = attention_ext.attention_decode_kernels(64, 4, 64, 4)
    assert (step.symbol, merge.obj) == ("attnd_step_bf16_hd64_q4_k64_n4", "attnd_hd64_q4_k64_n4.o")
    for bad, msg in ((lambda: gemv_ext.gemv_kernel(100, 100, 2, 4), "gemv: k=100 must be a multiple of 32"),
                     (lambda: gemv_ext.gemv_kernel(2048, 2048, 0, 4), "gemv: tile_m must be a positive int"),
                     (lambda: gemv_ext.gemv_kernel(2048, 768, 2, 4), "gemv: kc=768 must divide k=2048"),
                     (lambda: gemv_ext.gemv_kernel(2048, 2048, 3, 4), "gemv: tile_m=3 must divide rows=4"),
                     (lambda: attention_ext.attention_prefill_kernels(64, 32, 40), "attention: lk=40 must be a multiple of 16"),
                     (lambda: attention_ext.attention_prefill_kernels(64, 12, 32), "attention: lq=12 must be a multiple of 8"),
                     (lambda: attention_ext.attention_prefill_kernels(64, 16, 32),
                      r"attention: lq=16 must lie in \[lk, 2\*lk\]"),
                     (lambda: attention_ext.attention_decode_kernels(64, 4, 32, 32), "attention: n_parts=32 exceeds 16"),
                     (lambda: rope_ext.rope_kernel(48, 2), "rope: head_dim=48"),
                     (lambda: rmsnorm_ext.rmsnorm_kernel(48, 1), "rmsnorm: group=48 must be a multiple of 32"),
                     (lambda: add_ext.add_kernel(100), "add: n=100 must be a multiple of 32")):
        with pytest.raises(ValueError, match=msg):
            bad()
    zero, mac, out, glu, bias = gemm_ext.gemm_kernels(64, 64, 32)
    assert zero.obj == mac.obj == out.obj == glu.obj == bias.obj == "gemm_m64_k64_n32.o" and mac.source == "gemm.cc"
    assert (zero.symbol, mac.symbol, out.symbol, glu.symbol, bias.symbol) == (
        "gemm_zero_bf16_m64_k64_n32", "gemm_mac_bf16_m64_k64_n32", "gemm_out_bf16_m64_k64_n32",
        "gemm_glu_bf16_m64_k64_n32", "gemm_bias_bf16_m64_k64_n32")
    assert ("AIE_API_EMULATE_BFLOAT16_MMUL_WITH_BFP16", "1") in mac.defines
    with pytest.raises(ValueError, match="gemm: tile_n=24 must be a multiple of 16"):
        gemm_ext.gemm_kernels(64, 64, 24)
    with pytest.raises(ValueError, match="gemm: tile_m=12 must be a multiple of 8"):
        gemm_ext.gemm_kernels(12, 64, 32)


def test_fingerprint_tracks_source_defines_and_flags(monkeypatch):
    a, b = gemv_ext.gemv_kernel(2048, 2048, 2, 4), gemv_ext.gemv_kernel(2048, 2048, 4, 4)
    fa = compile_rules.kernel_fingerprint(a)
    assert len(fa) == 64 and fa == compile_rules.kernel_fingerprint(gemv_ext.gemv_kernel(2048, 2048, 2, 4))
    assert fa != compile_rules.kernel_fingerprint(b)
    monkeypatch.setattr(compile_rules, "PEANO_FLAGS", compile_rules.PEANO_FLAGS + ("-O3",))
    assert compile_rules.kernel_fingerprint(a) != fa


def test_kernel_for_object_inverts_object_names():
    for kern in (gemv_ext.gemv_kernel(8192, 512, 16, 256), rope_ext.rope_kernel(128, 24, 1), rope_ext.rope_kernel(64, 4, 2),
                 swiglu_ext.swiglu_kernel(512), rmsnorm_ext.rmsnorm_kernel(2048, 2), add_ext.add_kernel(4096),
                 attention_ext.attention_prefill_kernels(64, 64, 32).init, attention_ext.attention_decode_kernels(128, 3, 32, 4).init,
                 gemm_ext.gemm_kernels(64, 64, 64).zero):
        assert ext.kernel_for_object(kern.obj) == kern
    assert ext.kernel_for_object(attention_ext.attention_prefill_kernels(64, 64, 32).update.obj).symbol == \
        "attnp_init_bf16_hd64_q64_k32"
    assert ext.kernel_for_object(attention_ext.attention_decode_kernels(64, 4, 64, 4).out.obj).symbol == \
        "attnd_init_bf16_hd64_q4_k64_n4"
    assert ext.kernel_for_object("mv_k08192_c512_m16_r256.o") is None  # not a name the registry produces
    assert ext.kernel_for_object("zero.o") is None
    with pytest.raises(ValueError, match="gemv: k=100"):
        ext.kernel_for_object("mv_k100_c100_m2_r4.o")
