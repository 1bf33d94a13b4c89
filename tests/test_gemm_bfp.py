"""The `gemm_bfp` kernel (the prefill GEMM on weights at rest in block float, kernel_builder/block_float.py): the
reference is gemm / gemm_swiglu on the decoded weight; the AIE2P vector path on the host aie_api, fed the bytes
block_float.encode writes, gives the bits of gemm.cc's vector path on the bf16 weight (its in-core conversion rounds
like the encoder: the at-rest bytes are what the kernel reads) and stays within the block-float model's bound; its
counts equal the cost descriptor; a W block stride off by one fails; the C++ scalar path's numpy model and the
emu / emu-interp module equal the reference; the hardware model accepts the modules at the SmolLM2-135M and
Llama-3.2-1B prefill shapes; bad shapes and weights give one clear error."""
from __future__ import annotations

import re

import numpy as np
import pytest

from external_kernels.paths import SOURCE_DIR
from kernel_builder import aie_host, block_float
from kernel_builder.aie_host_runs import block, gemm_bfp_reference, unblock
from kernel_builder.gemm.external import bfp_chunk_k, gemm_kernels, scratch_elems
from kernel_builder.gemm.reference import gemm
from kernel_builder.gemm_bfp import external as bfp_ext
from kernel_builder.gemm_bfp.plan import plan
from kernel_builder.gemm_bfp.reference import gemm_bfp
from kernel_builder.gemm_swiglu.layout import interleave
from kernel_builder.gemm_swiglu.reference import gemm_swiglu
from kernel_builder.external_costs import external_cost
from kernel_builder.instr_counts import Counts
from kernel_builder.numerics import BF16, to_bf16
from tooling import require_tool

A = aie_host.aligned
TILES = [(16, 32, 32), (8, 64, 48), (16, 64, 32)]   # (tile_m, tile_k, tile_n): kUM 2 and 1; one and two K chunks


def _rand(rng, shape, scale=1.0):
    return to_bf16(rng.standard_normal(shape).astype(np.float32) * np.float32(scale))


def _w_slice(wb: np.ndarray, tk: int, s: int) -> np.ndarray:
    """The L1 W tile of K step s, in K chunks (gemm_bfp.cc), cut by hand from the at-rest bytes: each chunk the
    block rows' runs [9 * (s * tk + q * C), +9 C) of wb, one block row after the other."""
    c = bfp_chunk_k(tk)
    return np.concatenate([wb[:, 9 * (s * tk + q * c):9 * (s * tk + (q + 1) * c)].reshape(-1) for q in range(tk // c)])


def _run_bfp(t, a, wb, lib=None):
    """zero, one mac per K step on the encoded W tiles, out: the tile's bf16 output [tm, tn] and the first counts."""
    tm, tk, tn = t
    ks = bfp_ext.gemm_bfp_kernels(*t)
    lib = lib or aie_host.load(ks.mac)
    acc = A(np.full(2 * tm * tn, np.nan, BF16))
    scratch = A(np.full(scratch_elems(tm, tk), np.nan, BF16))
    lib.call(ks.zero.symbol, acc)
    counts = None
    for s in range(a.shape[1] // tk):
        c = lib.call(ks.mac.symbol, A(block(a[:, s * tk:(s + 1) * tk])), A(_w_slice(wb, tk, s)), acc, scratch)
        counts = counts or c
    lib.call(ks.out.symbol, acc)
    return unblock(acc[:tm * tn], tm, tn), counts


def _run_bf16(t, a, w):
    """gemm.cc's mac (host aie_api) on the bf16 weight: converts each W tile to block float in the core."""
    tm, tk, tn = t
    ks = gemm_kernels(*t)
    lib = aie_host.load(ks.mac)
    acc = A(np.full(2 * tm * tn, np.nan, BF16))
    scratch = A(np.zeros(scratch_elems(tm, tk), BF16))
    lib.call(ks.zero.symbol, acc)
    for s in range(a.shape[1] // tk):
        lib.call(ks.mac.symbol, A(block(a[:, s * tk:(s + 1) * tk])), A(block(w[:, s * tk:(s + 1) * tk])), acc,
                 scratch)
    lib.call(ks.out.symbol, acc)
    return unblock(acc[:tm * tn], tm, tn)


def _case(t, steps=3, seed=0):
    tm, tk, tn = t
    rng = np.random.default_rng(seed + tm + tk)
    a = _rand(rng, (tm, steps * tk))
    # rows of very different magnitudes: the per-group exponents matter
    w = _rand(rng, (tn, steps * tk)) * to_bf16(np.exp2(rng.integers(-6, 4, size=(tn, 1))).astype(np.float32))
    return a, to_bf16(w.astype(np.float32))


def test_reference_is_gemm_on_the_decoded_weight():
    rng = np.random.default_rng(1)
    m, k, n = 24, 64, 48
    a, w = _rand(rng, (m, k)), _rand(rng, (n, k), 0.1)
    wb = block_float.encode(w)
    wq = block_float.decode(wb, n, k)
    want = to_bf16(a.astype(np.float64) @ wq.astype(np.float64).T)
    got = gemm_bfp(a, wb.view(np.int8), m=m, k=k, n=n)
    np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=2.0**-7,
                               atol=2.0**-10 * np.abs(want.astype(np.float64)).max())
    g, u = _rand(rng, (n, k), 0.1), _rand(rng, (n, k), 0.1)
    wi = interleave(g, u)
    got = gemm_bfp(a, block_float.encode(wi), m=m, k=k, n=n, glu=1)
    np.testing.assert_array_equal(got, gemm_swiglu(a, block_float.quantize(wi), m=m, k=k, n=n))
    with pytest.raises(ValueError, match=r"expected 3456 bytes \(uint8\) for \[48, 64\], got 3408"):
        gemm_bfp(a, wb[:, :-8], m=m, k=k, n=n)


@pytest.mark.parametrize("t", TILES, ids=lambda t: "m{}_k{}_n{}".format(*t))
def test_vector_path_reads_the_encoded_bytes_and_counts(t):
    require_tool("g++")
    a, w = _case(t)
    got, counts = _run_bfp(t, a, block_float.encode(w))
    # the same block-float values and the same loop as gemm.cc's vector path on the bf16 weight: the same bits
    np.testing.assert_array_equal(got, _run_bf16(t, a, w))
    # ... within the block-float model's bound (aie_host_runs: 2^-8 |ref| + 2^-12 max|ref|)
    want = gemm_bfp_reference(a, w).astype(np.float64)
    assert np.all(np.abs(got.astype(np.float64) - want) <= 2.0**-8 * np.abs(want) + 2.0**-12 * np.abs(want).max())
    cost = bfp_ext.COSTS[1]
    sym = bfp_ext.gemm_bfp_kernels(*t).mac.symbol
    formula = cost.work(cost.pattern.fullmatch(sym), []).counts
    assert Counts._of(formula).host() == {kind: v for kind, v in counts.items() if v}
    tm, tk, tn = t
    assert counts["bfp16_convert"] == tm * tk // 64            # A only: no W conversion
    assert counts["mmul_bfp16_8x8x8"] == tm * tk * tn // 512


def test_epilogue_counts_equal_the_descriptor():
    require_tool("g++")
    t = TILES[0]
    ks = bfp_ext.gemm_bfp_kernels(*t)
    lib = aie_host.load(ks.mac)
    acc = A(np.zeros(2 * t[0] * t[2], BF16))
    b = A(np.zeros(t[2], BF16))
    for part in ("zero", "out", "glu", "bias"):
        sym = getattr(ks, part).symbol
        host = lib.call(sym, acc, *([b] if part == "bias" else []))
        ec = external_cost(sym)
        want = Counts._of(ec[0].work(ec[1], []).counts).host()
        assert want == {kind: v for kind, v in host.items() if v}, part


MUTANTS = [  # (file, pattern, replacement): W read one row (9 bytes) off; the second K chunk's blocks one block off
    ("gemm_bfp.cc", r"reinterpret_cast<bfp16ebs8 \*>\(w\), acc\)", "reinterpret_cast<bfp16ebs8 *>(w + 9), acc)"),
    ("gemm.cc", r"y0s\.seek\(\(c \* kNB \+ nb\) \* kWC\);", "y0s.seek((c * kNB + nb) * kWC + c);"),
]


@pytest.mark.parametrize("mutant", MUTANTS, ids=["w_row_offset", "chunk_seek"])
def test_w_block_stride_off_by_one_fails(tmp_path, mutant):
    require_tool("g++")
    name, pattern, repl = mutant
    for dep in ("gemm_bfp.cc", "gemm.cc", "kernel_common.h"):
        (tmp_path / dep).write_text((SOURCE_DIR / dep).read_text())
    mutated, n = re.subn(pattern, repl, (tmp_path / name).read_text())
    assert n >= 1
    (tmp_path / name).write_text(mutated)
    t = TILES[1]                                             # two K chunks per tile
    a, w = _case(t)
    lib = aie_host.load(bfp_ext.gemm_bfp_kernels(*t).mac, source=tmp_path / "gemm_bfp.cc")
    try:
        got, _ = _run_bfp(t, a, block_float.encode(w), lib)
    except aie_host.AieHostError:
        return                                               # the host aie_api caught the stray access itself
    assert not np.array_equal(got, _run_bf16(t, a, w))


def test_scalar_path_equals_its_numpy_model(tmp_path):
    """The C++ host scalar path (decode the published layout, f32 accumulation in ascending k) bit for bit against
    the interpreter's numpy model (block_float.decode + gemm.cc's accumulation order), and the reference within
    gemm's bound."""
    import ctypes
    import subprocess
    from external_kernels import compile_rules
    from kernel_builder.externals import external_model
    from multi_launch_builder.emulator.air_interp import MemRef
    cxx = require_tool("g++")
    t = tm, tk, tn = TILES[1]
    ks = bfp_ext.gemm_bfp_kernels(*t)
    subprocess.run(compile_rules.host_compile_command(ks.mac, tmp_path, cxx=cxx), check=True)
    so = tmp_path / "k.so"
    subprocess.run(compile_rules.host_link_command([tmp_path / compile_rules.host_object_name(ks.mac)], so, cxx=cxx),
                   check=True)
    lib = ctypes.CDLL(str(so))
    p = lambda x: x.ctypes.data_as(ctypes.c_void_p)   # noqa: E731
    a, w = _case(t)
    wb = block_float.encode(w)
    acc, scratch = np.zeros(2 * tm * tn, BF16), np.zeros(scratch_elems(tm, tk), BF16)
    macc = MemRef(acc.copy(), acc.shape, "bf16")
    mscratch = MemRef(scratch.copy(), scratch.shape, "bf16")
    model = external_model(ks.mac.symbol)
    for s in range(a.shape[1] // tk):
        at, wt = np.ascontiguousarray(block(a[:, s * tk:(s + 1) * tk])), _w_slice(wb, tk, s)
        getattr(lib, ks.mac.symbol)(p(at), p(wt), p(acc), p(scratch))
        model(MemRef(at.copy(), at.shape, "bf16"), MemRef(wt.view(np.int8).copy(), wt.shape, "i8"), macc, mscratch)
        np.testing.assert_array_equal(acc.view(np.uint16), macc.data.view(np.uint16))
    got = to_bf16(unblock(acc.view(np.float32), tm, tn))
    want = gemm(a, block_float.decode(wb, tn, a.shape[1]), m=tm, k=a.shape[1], n=tn).astype(np.float64)
    assert np.all(np.abs(got.astype(np.float64) - want) <= 2.0**-7 * np.abs(want) + 2.0**-10 * np.abs(want).max())


def _interp(text, a, wb, c):
    from multi_launch_builder.emulator import air_interp
    return air_interp.compile_module(text).run([a, wb.view(np.int8), c])


@pytest.mark.parametrize("m,k,n,glu", [(64, 576, 192, 0), (64, 256, 128, 1)])
def test_module_on_emu_interp_and_emu(m, k, n, glu):
    from multi_launch_builder.emulator.launch_program import ReferenceExecutor, read_launch_program, run_program
    from kernel_builder.registry import kernel_text
    rng = np.random.default_rng(3)
    a = _rand(rng, (m, k))
    w = _rand(rng, ((1 + glu) * n, k), 0.2)
    wb = block_float.encode(w)
    text = kernel_text("gemm_bfp", m, k, n, "swiglu" if glu else "none")
    want = gemm_bfp(a, wb, m=m, k=k, n=n, glu=glu).astype(np.float64)
    c = np.zeros((m, n), BF16)
    _interp(text, a, wb, c)
    # the interpreter runs the scalar path's model (f32 accumulation in ascending k; the reference's BLAS differs
    # only in order): two bf16 ulps plus cancellation slack (glu: two more for the activation's inputs)
    tol = (4 if glu else 2) * 2.0**-7
    err = np.abs(c.astype(np.float64) - want)
    assert np.all(err <= tol * np.abs(want) + 2.0**-9 * np.abs(want).max()), err.max()
    bufs = [a, wb.view(np.int8), np.zeros((m, n), BF16)]
    run_program(read_launch_program(text), bufs, ReferenceExecutor())
    np.testing.assert_array_equal(np.asarray(bufs[2]).reshape(m, n), want.astype(np.float32).astype(BF16))


LLAMA_1B = [(2048, 2048, 8192, "swiglu"), (2048, 8192, 2048, "none"), (2048, 2048, 2048, "none"),
            (2048, 2048, 512, "none")]
SMOLLM2 = [(256, 576, 1536, "swiglu"), (256, 1536, 576, "none"), (256, 576, 576, "none"), (256, 576, 192, "none")]


@pytest.mark.parametrize("m,k,n,epi", LLAMA_1B + SMOLLM2)
def test_hardware_model_accepts(m, k, n, epi):
    from kernel_builder.hw import analyze_module
    from kernel_builder.hw.tune import runtime_tiling
    from kernel_builder.presets import AirccPreset
    from kernel_builder.registry import kernel_text
    text = kernel_text("gemm_bfp", m, k, n, epi)
    rep = analyze_module(text, preset=AirccPreset(runtime_loop_tiling_sizes=runtime_tiling(text)))
    assert rep.ok, rep.first_violation()
    # W moves as 72-byte blocks: the weight's bytes are 9/16 of the bf16 GEMM's
    assert f"memref<{(2 if epi == 'swiglu' else 1) * n // 8}x{9 * k}xi8>" in text
    if (m, k, n, epi) in LLAMA_1B:   # the analyzer's launch cost (likely scenario) beats the bf16 GEMM's
        from kernel_builder.hw import cost
        bf16 = kernel_text("gemm_swiglu" if epi == "swiglu" else "gemm", m, k, n)
        ref = analyze_module(bf16, preset=AirccPreset(runtime_loop_tiling_sizes=runtime_tiling(bf16)))
        (la,), (lb,) = rep.launches, ref.launches
        assert cost.launch_cost(la.work).total_s < 0.8 * cost.launch_cost(lb.work).total_s


def test_plans_stream_nine_sixteenths_of_the_bf16_weight():
    from kernel_builder.gemm.plan import modeled_seconds, plan_gemm
    for m, k, n, epi in LLAMA_1B:
        p, q = plan(m, k, n, epi), plan_gemm(m, k, n, epi)
        assert p.w_format == "bfp16" and p.w_bytes(n, k) * 16 == q.w_bytes(n, k) * 9
        assert modeled_seconds(p, m, k, n) < modeled_seconds(q, m, k, n)
        # every contiguous W run within the BD limits the real lowering enforces: a chunk of a tile_k slice per
        # block row on a memory-tile BD dim (<= 512 i8), a panel row on the shim (<= 1023)
        assert 9 * bfp_chunk_k(p.tile_k) <= 512 and 9 * p.tile_k_l2 <= 1023
    assert plan(2048, 2048, 8192, "swiglu").tile_k == 64 and bfp_chunk_k(64) == 32


def test_w_tile_is_the_dma_order():
    """external.w_tile (the tile the module delivers, in K chunks) is the hand-cut one of these tests."""
    rng = np.random.default_rng(2)
    wb = block_float.encode(_rand(rng, (48, 256)))
    for tk, s in ((64, 1), (32, 3), (128, 1)):
        np.testing.assert_array_equal(bfp_ext.w_tile(wb, tk, s), _w_slice(wb, tk, s))
        np.testing.assert_array_equal(bfp_ext.tile_values(_w_slice(wb, tk, s), tk, 48),
                                      block_float.decode(wb, 48, 256)[:, s * tk:(s + 1) * tk])


@pytest.mark.parametrize("args,msg", [((64, 576, 196), "n=196 and k=576 must be positive multiples of 8"),
                                      ((64, 572, 192), "n=192 and k=572 must be positive multiples of 8"),
                                      ((64, 576, 192, "bias"), "unknown epilogue 'bias'"),
                                      ((64, 576, 200), "m=64 must be a positive multiple of 8 and n=200 of 16"),
                                      ((60, 576, 192), "m=60 must be a positive multiple of 8 and n=192 of 16")])
def test_bad_shapes_give_one_clear_error(args, msg):
    from kernel_builder.gemm_bfp.builder import build
    with pytest.raises(ValueError, match=re.escape(msg)):
        build(*args)


def test_module_refuses_a_weight_of_the_wrong_size():
    from multi_launch_builder.emulator import air_interp
    from kernel_builder.registry import kernel_text
    m, k, n = 64, 576, 192
    mod = air_interp.compile_module(kernel_text("gemm_bfp", m, k, n))
    a = np.zeros((m, k), BF16)
    with pytest.raises(ValueError, match=re.escape("gemm_bfp: argument %arg1 is 124224xint8, expected (24, 5184) i8")):
        mod.run([a, np.zeros((n // 8, 9 * k - 8), np.int8), np.zeros((m, n), BF16)])


def test_module_runs_the_vector_path_on_the_interpreter(monkeypatch):
    """emu-interp with LLAMA_NPU_EXTERNALS=aie-host: the herd's mac calls run gemm_bfp.cc's AIE2P path on the L1 W
    tiles the module's DMAs cut from the at-rest bytes: the block-float model's result (aie_host_runs' bound), and
    the bits of the bf16 gemm module's vector path on the same weight (the same values, the same loop)."""
    from kernel_builder.registry import kernel_text
    require_tool("g++")
    from kernel_builder.aie_host_models import model_for
    monkeypatch.setenv("LLAMA_NPU_EXTERNALS", "aie-host")
    m, k, n = 64, 576, 192
    p = plan(m, k, n)
    assert model_for(bfp_ext.gemm_bfp_kernels(p.tile_m, p.tile_k, p.tile_n).mac.symbol).__module__ == \
        "kernel_builder.aie_host_models"
    rng = np.random.default_rng(11)
    a, w = _rand(rng, (m, k)), _rand(rng, (n, k), 0.2)
    c = np.zeros((m, n), BF16)
    _interp(kernel_text("gemm_bfp", m, k, n), a, block_float.encode(w), c)
    want = gemm_bfp_reference(a, w).astype(np.float64)
    got = c.astype(np.float64)
    assert np.all(np.abs(got - want) <= 2.0**-8 * np.abs(want) + 2.0**-12 * np.abs(want).max())


@pytest.mark.parametrize("symbol,kind", [("gemm_bfp_mac_bf16_m64_k64_n64", "gemm_bfp"),
                                         ("gemm_bfp_glu_bf16_m64_k64_n64", "gemm_bfp"),
                                         ("gemm_bfp_bias_bf16_m64_k64_n64", "gemm_bfp_bias")])
def test_symbols_find_their_kind(symbol, kind):
    from kernel_builder.externals import family_of_symbol
    from kernel_builder.registry import spec
    assert family_of_symbol(symbol)[0] is spec(kind).families[0]
    assert external_cost(symbol)[0] in spec(kind).costs


def test_bias_module_on_emu_interp_emu_and_the_hardware_model():
    """gemm_bfp_bias (Qwen-style biased projections): the bias slice rides the W channel ahead of the i8 tiles."""
    from kernel_builder.gemm_bfp_bias.reference import gemm_bfp_bias
    from kernel_builder.gemm_bias.reference import gemm_bias
    from kernel_builder.hw import analyze_module
    from kernel_builder.registry import kernel_text
    from multi_launch_builder.emulator.launch_program import ReferenceExecutor, read_launch_program, run_program
    m, k, n = 64, 576, 192
    rng = np.random.default_rng(4)
    a, w, b = _rand(rng, (m, k)), _rand(rng, (n, k), 0.2), _rand(rng, (1, n))
    wb = block_float.encode(w)
    want = gemm_bfp_bias(a, wb, b, m=m, k=k, n=n)
    np.testing.assert_array_equal(want, gemm_bias(a, block_float.quantize(w), b, m=m, k=k, n=n))
    text = kernel_text("gemm_bfp_bias", m, k, n)
    assert analyze_module(text).ok and 'kind = "gemm_bfp_bias"' in text
    from multi_launch_builder.emulator import air_interp
    c = np.zeros((m, n), BF16)
    air_interp.compile_module(text).run([a, wb.view(np.int8), b, c])
    w64 = want.astype(np.float64)
    err = np.abs(c.astype(np.float64) - w64)
    assert np.all(err <= 2 * 2.0**-7 * np.abs(w64) + 2.0**-9 * np.abs(w64).max()), err.max()
    bufs = [a, wb.view(np.int8), b, np.zeros((m, n), BF16)]
    run_program(read_launch_program(text), bufs, ReferenceExecutor())
    np.testing.assert_array_equal(np.asarray(bufs[3]).reshape(m, n), want)
    with pytest.raises(ValueError, match=re.escape("gemm_bfp_bias: n=196 and k=576 must be positive multiples of 8")):
        kernel_text("gemm_bfp_bias", m, k, 196)


LOWER_CASES = [("gemm_bfp", s) for s in LLAMA_1B + SMOLLM2[:2]] + [("gemm_bfp_bias", (256, 896, 896)),
                                                                   ("gemm_bfp_bias", (2048, 896, 128))]


@pytest.mark.skipif(not __import__("os").environ.get("LLAMA_NPU_AIR_LOWER"),
                    reason="LLAMA_NPU_AIR_LOWER not set (no mlir-air/mlir-aie lowering here)")
@pytest.mark.parametrize("kind,shape", LOWER_CASES, ids=lambda c: str(c))
def test_real_lowering(tmp_path, kind, shape):
    """Every module above through the real pipeline (docs/verification.md "Real lowering"), with the hardware
    model's runtime loop tiling, as `llama-npu check-lowering` lowers it."""
    import os
    from kernel_builder.hw.tune import runtime_tiling
    from kernel_builder.presets import AirccPreset
    from kernel_builder.registry import kernel_text
    from multi_launch_builder.compile.lowering import lower_with_tool
    text = kernel_text(kind, *shape)
    src = tmp_path / f"{kind}.mlir"
    src.write_text(text)
    preset = AirccPreset(runtime_loop_tiling_sizes=runtime_tiling(text))
    res = lower_with_tool(os.environ["LLAMA_NPU_AIR_LOWER"], src, tmp_path / "out", preset.flags(), timeout=1800)
    assert res.ok, f"{res.stage}: {res.message}"


@pytest.mark.parametrize("obj", ["gemm_bfp_m64_k64_n64.o", "gemm_bfp_m8_k64_n48.o"])
def test_host_runs_driver_and_counts(obj):
    """kernel_builder.aie_host_runs drives the object like gemm's (out, glu, bias on the encoded weight) within the
    block-float model's bounds, and every call's counts equal the descriptor (tests/test_kernel_counts.py)."""
    from kernel_builder import aie_host_runs as runs
    from tests.test_kernel_counts import _check, recorded_calls
    require_tool("g++")
    r = runs.run(obj, np.random.default_rng(5))
    assert not runs.mismatch(r), runs.mismatch(r)
    _check(obj, recorded_calls(obj))
