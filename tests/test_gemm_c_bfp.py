"""The block-float GEMM writing its output C in block float (gemm_bfp(..., c="bfp16"), GemmPlan.c_format "bfp16",
external_kernels/gemm_c_bfp.h): c = i8 [m/8, 9n], block_float.encode of the bf16 result the bf16 epilogues write.
The epilogues' AIE2P vector path and host scalar path on the host aie_api give exactly those bytes (and broken
variants do not); their counts equal the cost descriptor; the module on emu-interp (streamed and A-resident plans)
writes the bytes of the bf16 module's output encoded, and emu the reference's; the hardware model accepts the
gate/up modules of the prefill shapes and rejects a broken one; c="bf16" texts are unchanged; bad inputs give one
clear error."""
from __future__ import annotations

import re

import numpy as np
import pytest

from external_kernels.paths import SOURCE_DIR
from kernel_builder import aie_host, block_float
from kernel_builder.aie_host_runs import unblock
from kernel_builder.external_costs import external_cost
from kernel_builder.gemm.external import c_epilogue, gemm_kernels
from kernel_builder.gemm_bfp.plan import plan
from kernel_builder.gemm_bfp.reference import gemm_bfp
from kernel_builder.instr_counts import Counts
from kernel_builder.numerics import BF16, to_bf16
from kernel_builder.registry import kernel_text
from tooling import require_tool

A = aie_host.aligned
TILES = [(16, 32, 32), (8, 64, 48), (24, 64, 64)]   # (tile_m, tile_k, tile_n)
EPIS = ("none", "swiglu")


def _acc(t, seed=0) -> np.ndarray:
    """An f32 accumulator tile (as the bf16 memref's bytes) with rows of very different magnitudes, exact ties."""
    tm, _, tn = t
    rng = np.random.default_rng(seed + tm + tn)
    v = rng.standard_normal(tm * tn) * np.exp2(rng.integers(-8, 6, tm * tn))
    v[::7] = np.float32(1.0 + 2.0**-8)        # halfway between two bf16 values: RNE must round it down
    v[::11] = 0.0
    v[:64] = 0.0                              # an all-zero block (E = 0)
    return v.astype(np.float32).view(BF16)


def _out_n(t, epi):
    return t[2] // 2 if epi == "swiglu" else t[2]


def _want(lib, ks, t, epi, acc) -> np.ndarray:
    """block_float.encode of the bf16 tile the bf16 epilogue of the same path writes: [tm/8, 9 out_n] bytes."""
    ref = A(acc.copy())
    lib.call(ks.epilogue(epi).symbol, ref)
    tm, on = t[0], _out_n(t, epi)
    return block_float.encode(unblock(ref[:tm * on], tm, on).astype(np.float32))


@pytest.mark.parametrize("t", TILES, ids=lambda t: "m{}_k{}_n{}".format(*t))
@pytest.mark.parametrize("epi", EPIS)
def test_vector_path_writes_the_encoded_bf16_tile_and_counts(t, epi):
    require_tool("g++")
    ks = gemm_kernels(*t, "bfp16")
    lib = aie_host.load(ks.mac)
    acc = _acc(t)
    got = A(acc.copy())
    sym = c_epilogue(ks, epi, "bfp16").symbol
    counts = lib.call(sym, got)
    want = _want(lib, ks, t, epi, acc)
    np.testing.assert_array_equal(got.view(np.uint8)[:want.size].reshape(want.shape), want)
    ec = external_cost(sym)
    assert Counts._of(ec[0].work(ec[1], []).counts).host() == {k: v for k, v in counts.items() if v}
    assert counts["bfp16_convert"] == t[0] * _out_n(t, epi) // 64 and counts["vstore_bytes"] == want.size


MUTANTS = [  # the second 32-lane half of a block read 8 lanes early; an output block stored one row (9 bytes) late
    ("gemm_c_bfp.h", r"acc_bf16\(acc, i \+ kLanes\)", "acc_bf16(acc, i + kLanes - 8)"),
    ("gemm_c_bfp.h", r"BfpOut out\(reinterpret_cast<bfp16ebs8 \*>\(acc_bytes\)\);\n  for \(int b = 0; b < kMB \* kNB",
     "BfpOut out(reinterpret_cast<bfp16ebs8 *>(reinterpret_cast<uint8_t *>(acc_bytes) + 9));\n"
     "  for (int b = 0; b < kMB * kNB"),
]


@pytest.mark.parametrize("mutant", MUTANTS, ids=["half_offset", "block_store_offset"])
def test_broken_vector_path_fails(tmp_path, mutant):
    require_tool("g++")
    name, pattern, repl = mutant
    for dep in ("gemm_bfp.cc", "gemm.cc", "gemm_c_bfp.h", "kernel_common.h"):
        (tmp_path / dep).write_text((SOURCE_DIR / dep).read_text())
    mutated, n = re.subn(pattern, repl, (tmp_path / name).read_text())
    assert n == 1
    (tmp_path / name).write_text(mutated)
    t = TILES[0]
    ks = gemm_kernels(*t, "bfp16")
    good, bad = aie_host.load(ks.mac), aie_host.load(ks.mac, source=tmp_path / "gemm_bfp.cc")
    acc = _acc(t)
    want = _want(good, ks, t, "none", acc)
    got = A(acc.copy())
    try:
        bad.call(c_epilogue(ks, "none", "bfp16").symbol, got)
    except aie_host.AieHostError:
        return
    assert not np.array_equal(got.view(np.uint8)[:want.size].reshape(want.shape), want)


def _scalar_lib(tmp_path, ks, source=None):
    import ctypes
    import subprocess
    from external_kernels import compile_rules
    cxx = require_tool("g++")
    kern = ks.mac if source is None else ks.mac
    cmd = compile_rules.host_compile_command(kern, tmp_path, cxx=cxx)
    if source is not None:
        cmd = [str(source) if c == str(kern.source_path) else c for c in cmd]
        assert str(source) in cmd
    subprocess.run(cmd, check=True)
    so = tmp_path / "k.so"
    subprocess.run(compile_rules.host_link_command([tmp_path / compile_rules.host_object_name(kern)], so, cxx=cxx),
                   check=True)
    return ctypes.CDLL(str(so))


def _scalar_run(lib, sym, acc):
    import ctypes
    buf = acc.copy()
    getattr(lib, sym)(buf.ctypes.data_as(ctypes.c_void_p))
    return buf


def test_scalar_path_equals_its_numpy_model_and_the_encoder(tmp_path):
    """The C++ host scalar outc / gluc: encode of the scalar out / glu's bf16 tile, bit for bit, and the
    interpreter's numpy model of them (gemm.cc's model, then block_float.encode)."""
    from kernel_builder.externals import external_model
    from multi_launch_builder.emulator.air_interp import MemRef
    t = tm, _, tn = TILES[2]
    ks = gemm_kernels(*t, "bfp16")
    lib = _scalar_lib(tmp_path, ks)
    acc = _acc(t, 5)
    for epi in EPIS:
        on = _out_n(t, epi)
        sym = c_epilogue(ks, epi, "bfp16").symbol
        got = _scalar_run(lib, sym, acc).view(np.uint8)[:tm * on * 9 // 8]
        bf = _scalar_run(lib, ks.epilogue(epi).symbol, acc)
        want = block_float.encode(unblock(bf[:tm * on], tm, on).astype(np.float32)).reshape(-1)
        np.testing.assert_array_equal(got, want)
        mr = MemRef(acc.copy(), acc.shape, "bf16")
        external_model(sym)(mr)
        np.testing.assert_array_equal(mr.data.view(np.uint8)[:want.size], want)
    # a broken scalar encoder (mantissas one binade too coarse) fails
    src = (SOURCE_DIR / "gemm_c_bfp.h").read_text()
    mutated, n = re.subn(r"std::ldexp\(static_cast<double>\(x\[i\]\), 6 - e\)",
                         "std::ldexp(static_cast<double>(x[i]), 5 - e)", src)
    assert n == 1
    mdir = tmp_path / "mut"
    mdir.mkdir()
    for dep in ("gemm_bfp.cc", "gemm.cc", "kernel_common.h"):
        (mdir / dep).write_text((SOURCE_DIR / dep).read_text())
    (mdir / "gemm_c_bfp.h").write_text(mutated)
    bad = _scalar_lib(mdir, ks, source=mdir / "gemm_bfp.cc")
    got = _scalar_run(bad, c_epilogue(ks, "none", "bfp16").symbol, acc).view(np.uint8)[:tm * tn * 9 // 8]
    bf = _scalar_run(lib, ks.out.symbol, acc)
    assert not np.array_equal(got, block_float.encode(unblock(bf[:tm * tn], tm, tn).astype(np.float32)).reshape(-1))


def test_reference_encodes_the_bf16_result():
    rng = np.random.default_rng(1)
    m, k, n = 16, 64, 32
    a = to_bf16(rng.standard_normal((m, k)).astype(np.float32))
    for glu in (0, 1):
        wb = block_float.encode(to_bf16(rng.standard_normal(((1 + glu) * n, k)).astype(np.float32)))
        c = gemm_bfp(a, wb, m=m, k=k, n=n, glu=glu, c_bfp=1)
        assert c.dtype == np.int8 and c.shape == (m // 8, 9 * n)
        np.testing.assert_array_equal(c.view(np.uint8), block_float.encode(
            gemm_bfp(a, wb, m=m, k=k, n=n, glu=glu).astype(np.float32)))


# (m, k, n, epilogue, A resident): tiles sent whole and in c_bfp.c_chunk pieces (out_n 48 / 32 and 64 / 128)
MODULES = [(64, 576, 192, "none", False), (256, 256, 256, "swiglu", False), (64, 256, 512, "none", False),
           (128, 256, 512, "swiglu", True), (128, 256, 1024, "none", True)]


@pytest.mark.parametrize("m,k,n,epi,resident", MODULES)
def test_module_on_emu_interp_and_emu(tmp_path, m, k, n, epi, resident):
    """emu-interp: the c="bfp16" module writes exactly block_float.encode of what the c="bf16" module writes (same
    plan, same accumulation), within the bf16 bound of the reference; emu (the launch program on the reference)
    and the emu devices: the reference's bytes."""
    from multi_launch_builder.devices.base import Artifact
    from multi_launch_builder.devices.emu import EmuDevice
    from multi_launch_builder.emulator import air_interp
    glu = int(epi == "swiglu")
    p = plan(m, k, n, epi, c="bfp16")
    assert p.a_resident == resident
    rng = np.random.default_rng(3)
    a = to_bf16(rng.standard_normal((m, k)).astype(np.float32))
    wb = block_float.encode(to_bf16((rng.standard_normal(((1 + glu) * n, k)) * 0.2).astype(np.float32)))
    text = kernel_text("gemm_bfp", m, k, n, epi, c="bfp16")
    c = np.zeros((m // 8, 9 * n), np.int8)
    air_interp.compile_module(text).run([a, wb.view(np.int8), c])
    c16 = np.zeros((m, n), BF16)
    air_interp.compile_module(kernel_text("gemm_bfp", m, k, n, epi)).run([a, wb.view(np.int8), c16])
    np.testing.assert_array_equal(c.view(np.uint8), block_float.encode(c16.astype(np.float32)))
    want = gemm_bfp(a, wb, m=m, k=k, n=n, glu=glu, c_bfp=1)
    got, ref = block_float.decode(c, m, n).astype(np.float64), block_float.decode(want, m, n).astype(np.float64)
    # bf16 rounding (the interpreter's ascending-k f32 sums vs BLAS) plus one block-float step of the group maximum
    assert np.all(np.abs(got - ref) <= (4 if glu else 2) * 2.0**-7 * np.abs(ref) + 2.0**-6 * np.abs(ref).max())
    path = tmp_path / "gemm_bfp.mlir"
    path.write_text(text)
    dev = EmuDevice()
    handle = dev.load(Artifact(name="gemm_bfp", mlir=path))
    bufs = []
    for x in (a, wb.view(np.int8), np.zeros((m // 8, 9 * n), np.int8)):
        bufs.append(dev.alloc(x.nbytes))
        dev.write(bufs[-1], x)
    dev.run(handle, bufs)
    np.testing.assert_array_equal(dev.read(bufs[-1], (m // 8, 9 * n), np.int8), want)


def test_module_texts_unchanged_for_bf16_c():
    for args in ((64, 576, 192, "none"), (2048, 2048, 8192, "swiglu"), (128, 256, 512, "swiglu")):
        text = kernel_text("gemm_bfp", *args)
        assert text == kernel_text("gemm_bfp", *args, c="bf16") and "c_bfp" not in text and "outc" not in text
        m, _, n, epi = args
        t2 = kernel_text("gemm_bfp", *args, c="bfp16")
        assert "c_bfp = 1" in t2 and f"memref<{m // 8}x{9 * n}xi8>" in t2
        assert ("gemm_bfpc_gluc_" if epi == "swiglu" else "gemm_bfpc_outc_") in t2


@pytest.mark.parametrize("call,msg", [
    (lambda: kernel_text("gemm_bfp", 64, 576, 192, "none", c="fp8"), "gemm_bfp: unknown C format 'fp8' (known: bf16, bfp16)"),
    (lambda: __import__("kernel_builder.gemm.plan", fromlist=["x"]).plan_gemm(64, 576, 192, c_format="fp8"),
     "gemm: unknown C format 'fp8'"),
    (lambda: __import__("kernel_builder.gemm.plan", fromlist=["x"]).plan_gemm(64, 576, 192, c_format="bfp16"),
     "C in block float needs W in block float"),
])
def test_bad_c_format_is_one_clear_error(call, msg):
    with pytest.raises(ValueError, match=re.escape(msg)):
        call()


# the gate/up GEMM at the prefill rows the model uses (Llama-3.2-1B; SmolLM2-135M at 256)
HW_SHAPES = [(64, 2048, 8192), (256, 2048, 8192), (1024, 2048, 8192), (2048, 2048, 8192), (256, 576, 1536)]


@pytest.mark.parametrize("m,k,n", HW_SHAPES)
def test_hardware_model_accepts_and_c_bytes_are_nine_sixteenths(m, k, n):
    from kernel_builder.gemm.plan import gemm_flows
    from kernel_builder.hw import analyze_module
    from kernel_builder.hw.tune import runtime_tiling
    from kernel_builder.presets import AirccPreset
    text = kernel_text("gemm_bfp", m, k, n, "swiglu", c="bfp16")
    rep = analyze_module(text, preset=AirccPreset(runtime_loop_tiling_sizes=runtime_tiling(text)))
    assert rep.ok, rep.first_violation()
    p, q = plan(m, k, n, "swiglu", c="bfp16"), plan(m, k, n, "swiglu")
    cb = lambda pl: sum(f.bytes for f in gemm_flows(pl, m, k, n) if f.what == "c")   # noqa: E731
    assert cb(p) * 16 == cb(q) * 9 and cb(p) == m * n * 9 // 8


@pytest.mark.parametrize("m,k,n", [(2048, 8192, 2048), (2048, 2048, 2048), (64, 8192, 2048), (256, 1536, 576)])
def test_hardware_model_accepts_the_plain_epilogue(m, k, n):
    from kernel_builder.hw import analyze_module
    from kernel_builder.hw.tune import runtime_tiling
    from kernel_builder.presets import AirccPreset
    text = kernel_text("gemm_bfp", m, k, n, "none", c="bfp16")
    rep = analyze_module(text, preset=AirccPreset(runtime_loop_tiling_sizes=runtime_tiling(text)))
    assert rep.ok, rep.first_violation()


# lowered with the real tool for this change (mlir-air efeb41ce4 + mlir-aie ae8ed9d): the gate/up GEMM of Llama-3.2-1B,
# SmolLM2-135M and Llama-3.2-3B at 64 / 256 / 1024 / 2048 rows, and plain-epilogue shapes (docs/kernels.md)
LOWER_CASES = [(m, k, n, "swiglu") for m in (64, 256, 1024, 2048) for k, n in ((2048, 8192), (576, 1536), (3072, 8192))] \
    + [(2048, 8192, 2048, "none"), (2048, 2048, 2048, "none"), (64, 8192, 2048, "none"), (2048, 2048, 512, "none"),
       (256, 1536, 576, "none"), (256, 576, 576, "none")]


@pytest.mark.skipif(not __import__("os").environ.get("LLAMA_NPU_AIR_LOWER"),
                    reason="LLAMA_NPU_AIR_LOWER not set (no mlir-air/mlir-aie lowering here)")
@pytest.mark.parametrize("shape", LOWER_CASES, ids=lambda c: "_".join(map(str, c)))
def test_real_lowering(tmp_path, shape):
    import os
    from kernel_builder.hw.tune import runtime_tiling
    from kernel_builder.presets import AirccPreset
    from multi_launch_builder.compile.lowering import lower_with_tool
    text = kernel_text("gemm_bfp", *shape, c="bfp16")
    src = tmp_path / "gemm_bfp.mlir"
    src.write_text(text)
    preset = AirccPreset(runtime_loop_tiling_sizes=runtime_tiling(text))
    res = lower_with_tool(os.environ["LLAMA_NPU_AIR_LOWER"], src, tmp_path / "out", preset.flags(), timeout=1800)
    assert res.ok, f"{res.stage}: {res.message}"


def test_hardware_model_rejects_an_unsplit_drain(monkeypatch):
    """A tile of out_n = 64 sent as one run of 9 * 64 = 576 bytes per block row: over a memory-tile BD dim
    (NPU2.bd_max_size; the real lowering refuses it); the builder sends it in c_bfp.c_chunk pieces."""
    from kernel_builder.gemm import c_bfp
    from kernel_builder.hw import analyze_module
    from kernel_builder.registry import clear_kernel_cache
    args = (256, 2048, 8192, "swiglu")
    p = plan(*args, c="bfp16")
    assert p.out_n == 64 and c_bfp.c_chunk(p) == 32
    monkeypatch.setattr(c_bfp, "c_chunk", lambda p: p.out_n)
    clear_kernel_cache()
    try:
        rep = analyze_module(kernel_text("gemm_bfp", *args, c="bfp16"))
        assert not rep.ok and "memtile BD wrap/stride (576/1" in rep.first_violation()
    finally:
        clear_kernel_cache()


def test_interpreter_rejects_a_tile_sent_in_bf16_bytes():
    """A module whose tiles send the bf16 tile's bytes (2 tile_m out_n) into the block-float row panels: the gets
    take 9/16 of them, the rest is left in flight (the device would hang): the interpreter refuses it."""
    from multi_launch_builder.emulator import air_interp
    m, k, n = 64, 576, 192
    p = plan(m, k, n, c="bfp16")
    text = kernel_text("gemm_bfp", m, k, n, c="bfp16")
    small, big = p.tile_m * p.out_n * 9 // 8, 2 * p.tile_m * p.out_n
    put = re.compile(rf"(air\.channel\.put\s+@gemm_c\[[^\]]*\] \(%\w+\[%\w+\] \[)%c{small}(_\d+)?\]")
    bad, cnt = put.subn(rf"\g<1>%cbig]", text)
    assert cnt == 1, re.findall(r"air\.channel\.put\s+@gemm_c.*", text)
    lines = bad.splitlines()
    i = next(i for i, ln in enumerate(lines) if "%cbig]" in ln)
    lines.insert(i, " " * 10 + f"%cbig = arith.constant {big} : index")
    with pytest.raises(Exception, match="left|unconsumed|in flight|finds only|hang"):
        air_interp.compile_module("\n".join(lines)).run([np.zeros((m, k), BF16), np.zeros((n // 8, 9 * k), np.int8),
                                                         np.zeros((m // 8, 9 * n), np.int8)])


def test_spread_plan_on_emu_interp(monkeypatch):
    """A spread plan (herd column j owns the output columns [j n/4, (j+1) n/4), as the planner picks for the down
    projection at 2048 x 8192 x 2048): each block row of a row panel leaves in herd_n pieces n/4 columns apart; the
    bytes equal block_float.encode of the c="bf16" module's output under the same plan."""
    import dataclasses
    from kernel_builder.gemm import builder as gemm_builder, plan as gemm_plan
    from multi_launch_builder.emulator import air_interp
    m, k, n = 64, 256, 256
    forced = gemm_plan.GemmPlan(8, 64, 32, 8, 4, tile_k_l2=64, k=k, spread=True, w_format="bfp16", c_format="bfp16")
    assert gemm_plan._gemm_fits(forced, k) and n // forced.bn_out == 2
    monkeypatch.setattr(gemm_plan, "plan_gemm", lambda *a, c_format="bf16", **kw: dataclasses.replace(
        forced, c_format=c_format))
    rng = np.random.default_rng(9)
    a = to_bf16(rng.standard_normal((m, k)).astype(np.float32))
    wb = block_float.encode(to_bf16((rng.standard_normal((n, k)) * 0.2).astype(np.float32)))
    c = np.zeros((m // 8, 9 * n), np.int8)
    air_interp.compile_module(gemm_builder.build(m, k, n, "none", "bfp16", c_format="bfp16")).run(
        [a, wb.view(np.int8), c])
    c16 = np.zeros((m, n), BF16)
    air_interp.compile_module(gemm_builder.build(m, k, n, "none", "bfp16")).run([a, wb.view(np.int8), c16])
    np.testing.assert_array_equal(c.view(np.uint8), block_float.encode(c16.astype(np.float32)))
    assert np.abs(c16.astype(np.float64)).min() >= 0 and np.any(c16 != 0)


def test_module_runs_the_vector_path_on_the_interpreter(monkeypatch, tmp_path):
    """emu-interp with LLAMA_NPU_EXTERNALS=aie-host (every call on gemm_bfp.cc's AIE2P path through the host aie_api,
    the accumulator typed i8) and the interp device: block_float.encode of the c="bf16" module's vector-path output."""
    from multi_launch_builder.devices.base import Artifact
    from multi_launch_builder.devices.interp import InterpEmuDevice
    from multi_launch_builder.emulator import air_interp
    require_tool("g++")
    m, k, n, epi = 64, 256, 128, "swiglu"
    rng = np.random.default_rng(12)
    a = to_bf16(rng.standard_normal((m, k)).astype(np.float32))
    wb = block_float.encode(to_bf16((rng.standard_normal((2 * n, k)) * 0.2).astype(np.float32)))
    text = kernel_text("gemm_bfp", m, k, n, epi, c="bfp16")
    monkeypatch.setenv("LLAMA_NPU_EXTERNALS", "aie-host")
    from kernel_builder.aie_host_models import model_for
    p = plan(m, k, n, epi, c="bfp16")
    sym = c_epilogue(gemm_kernels(p.tile_m, p.tile_k, p.tile_n, "bfp16", c="bfp16"), epi, "bfp16").symbol
    assert sym in text and model_for(sym).__module__ == "kernel_builder.aie_host_models"
    c = np.zeros((m // 8, 9 * n), np.int8)
    air_interp.compile_module(text).run([a, wb.view(np.int8), c])
    c16 = np.zeros((m, n), BF16)
    air_interp.compile_module(kernel_text("gemm_bfp", m, k, n, epi)).run([a, wb.view(np.int8), c16])
    np.testing.assert_array_equal(c.view(np.uint8), block_float.encode(c16.astype(np.float32)))
    monkeypatch.delenv("LLAMA_NPU_EXTERNALS")
    path = tmp_path / "gemm_bfp.mlir"
    path.write_text(text)
    dev = InterpEmuDevice()
    handle = dev.load(Artifact(name="gemm_bfp", mlir=path))
    bufs = []
    for x in (a, wb.view(np.int8), np.zeros((m // 8, 9 * n), np.int8)):
        bufs.append(dev.alloc(x.nbytes))
        dev.write(bufs[-1], x)
    dev.run(handle, bufs)
    c2 = np.zeros((m // 8, 9 * n), np.int8)
    air_interp.compile_module(text).run([a, wb.view(np.int8), c2])   # the scalar path's numpy model
    np.testing.assert_array_equal(dev.read(bufs[-1], (m // 8, 9 * n), np.int8), c2)
