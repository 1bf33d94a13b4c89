"""RMSNorm with its output in block float (`rmsnorm(..., out="bfp16")`, kernel_builder/rmsnorm/bfp_*.py,
external_kernels/rmsnorm_bfp.cc): y = i8 [rows/8, 9*dim], the at-rest format of kernel_builder/block_float.py.

Numerics: the reference (bfp=1) is block_float.encode of the bf16 reference, by definition. The AIE2P vector path
(host aie_api) computes rmsnorm.cc's bf16 values (same lanes, same order of the sums, r as the same bf16 pair), then
converts them as gemm.cc converts a stored bf16 block: its bytes equal block_float.encode of rmsnorm.cc's vector
output bit for bit (and that output is within one bf16 ulp of the reference, tests/test_aie_host_kernels.py); the
C++ scalar path equals the interpreter's numpy model bit for bit. The builder's calls (two phases per column chunk,
the r of every row kept between them) are driven here in the builder's order."""
from __future__ import annotations

import ctypes
import re
import subprocess

import numpy as np
import pytest
from tooling import require_tool

from external_kernels import compile_rules
from external_kernels.paths import SOURCE_DIR
from kernel_builder import aie_host, block_float
from kernel_builder.instr_counts import Counts
from kernel_builder.numerics import BF16, to_bf16
from kernel_builder.registry import kernel_text
from kernel_builder.rmsnorm import bfp_external as ext
from kernel_builder.rmsnorm.bfp_plan import RmsnormBfpPlan, modeled_seconds, plan_rmsnorm_bfp
from kernel_builder.rmsnorm.external import rmsnorm_kernel
from kernel_builder.rmsnorm.reference import rmsnorm

# (dim, chunk, blocks, offset, xwhole): the 8 rows whole; two blocks in four chunks; Gemma's (1 + w) in two chunks;
# the 8 whole rows of two blocks (one after the other, r of one block kept), each normalised in three chunks
VARIANTS = [(256, 256, 1, 0, 0), (256, 64, 2, 0, 0), (192, 96, 2, 1, 0), (192, 64, 2, 0, 1)]
EPS = 1e-5


def _data(dim, blocks, seed=3):
    rng = np.random.default_rng(seed)
    x = to_bf16(rng.standard_normal((8 * blocks, dim)).astype(np.float32) * np.float32(2.0))
    x[1] = to_bf16(np.float32(1e-3) * x[1])                  # eps matters in this row
    x[2, :8] = 0.0                                            # an all-zero group (E = 0)
    w = to_bf16(rng.standard_normal(dim).astype(np.float32))
    return x, w


def _drive(call, v, x, w):
    """The builder's call order for one tile: phase -> block -> chunk (one block whole: both phases per block; the 8
    whole rows of an `xwhole` kernel: per block one phase-1 call per chunk); the y chunks placed at their block-row
    bytes."""
    dim, chunk, blocks, offset, xwhole = v
    st = aie_host.aligned(np.full(ext.st_elems(blocks), np.nan, np.float32))
    y = np.zeros((blocks, 9 * dim), np.int8)
    yl = aie_host.aligned(np.zeros(9 * chunk, np.int8))
    calls = []
    steps = [(1, b, c0) for b in range(blocks) for c0 in range(0, dim, chunk)] if xwhole else \
        [(ph, b, c0) for ph in (0, 1) for b in range(blocks) for c0 in range(0, dim, chunk)]
    for phase, b, c0 in steps:
        xs = x[8 * b:8 * b + 8] if xwhole else x[8 * b:8 * b + 8, c0:c0 + chunk]
        calls.append(((phase, b, c0), call(aie_host.aligned(np.ascontiguousarray(xs)),
                                           aie_host.aligned(w[c0:c0 + chunk]), st, yl, EPS, phase,
                                           0 if xwhole else b, c0)))
        y[b, 9 * c0:9 * (c0 + chunk)] = yl
    return y, calls


# ------------------------------------------------------------------------------------------ reference, contract
def test_reference_is_encode_of_the_bf16_reference():
    x, w = _data(64, 2)
    y = rmsnorm(x, w, rows=16, dim=64, eps=EPS, bfp=1)
    assert y.dtype == np.int8 and y.shape == (2, 9 * 64)
    bf = rmsnorm(x, w, rows=16, dim=64, eps=EPS)
    np.testing.assert_array_equal(y.view(np.uint8), block_float.encode(bf))
    np.testing.assert_array_equal(block_float.decode(y, 16, 64), block_float.quantize(bf))
    y1 = rmsnorm(x, w, rows=16, dim=64, eps=EPS, offset=1, bfp=1)
    np.testing.assert_array_equal(y1.view(np.uint8), block_float.encode(rmsnorm(x, w, rows=16, dim=64, eps=EPS,
                                                                                 offset=1)))


def test_bad_inputs_are_one_clear_error():
    x, w = _data(64, 2)
    with pytest.raises(ValueError, match=r"rmsnorm: bfp=1 needs whole rows .* rows=12"):
        rmsnorm(x[:12], w, rows=12, dim=64, eps=EPS, bfp=1)
    with pytest.raises(ValueError, match=r"rmsnorm: out='bfp16' needs rows to be a multiple of 8 .* rows=12"):
        kernel_text("rmsnorm", 12, 64, EPS, out="bfp16")
    with pytest.raises(ValueError, match=r"rmsnorm: out='bfp16' normalises whole rows; group=32"):
        kernel_text("rmsnorm", 16, 64, EPS, 32, out="bfp16")
    with pytest.raises(ValueError, match=r"rmsnorm: out must be one of bf16, bfp16, got 'fp8'"):
        kernel_text("rmsnorm", 16, 64, EPS, out="fp8")
    with pytest.raises(ValueError, match=r"rmsnorm: chunk=48 must be a multiple of 32 dividing dim=256"):
        ext.rmsnorm_bfp_kernel(256, 48, 1)


def test_module_contract():
    """The signature the lead codes against and the launch attribute: `bfp = 1` only in the block-float module; the
    bf16 module text does not change with the new keyword."""
    t = kernel_text("rmsnorm", 16, 64, EPS, out="bfp16")
    assert "func.func @rmsnorm(%arg0: memref<16x64xbf16>, %arg1: memref<64xbf16>, %arg2: memref<2x576xi8>)" in t
    assert re.search(r'kind = "rmsnorm", rows = 16, dim = 64, eps = [^,]+, bfp = 1\}', t)
    assert "offset = 1, bfp = 1}" in kernel_text("rmsnorm", 16, 64, EPS, offset=1, out="bfp16")
    bf = kernel_text("rmsnorm", 16, 64, EPS)
    assert bf == kernel_text("rmsnorm", 16, 64, EPS, out="bf16") and "bfp" not in bf and "xi8" not in bf


def test_plans_at_model_shapes():
    """dim 576 holds 8 rows whole, ping-ponged; dim 2048 holds them whole in one copy (`single`: x read once, each
    block's DMA waiting for its calls) and 3072 too, normalised in chunks (`xwhole`), both modeled faster than two
    passes; 4096 streams two passes of chunks of at most 1023 columns (one shim BD dimension), an even number of
    them, within L1; the plan is the least modeled time."""
    for rows in (64, 256, 1024, 2048):
        p = plan_rmsnorm_bfp(rows, 576)
        assert (p.chunk, p.x_passes, p.single) == (576, 1, False)
    for rows in (256, 1024, 2048):
        p = plan_rmsnorm_bfp(rows, 2048)
        assert (p.chunk, p.x_passes, p.single) == (2048, 1, True) and p.l1_bytes() <= 60 * 1024
        two = RmsnormBfpPlan(rows, 2048, 8, rows // 64, 512)
        assert modeled_seconds(p) < 0.7 * modeled_seconds(two)
    p = plan_rmsnorm_bfp(2048, 3072)                           # 48 KiB of x whole, normalised in 768-column chunks
    assert (p.chunk, p.x_passes, p.xwhole) == (768, 1, True) and p.l1_bytes() <= 60 * 1024
    assert modeled_seconds(p) < 0.7 * modeled_seconds(RmsnormBfpPlan(2048, 3072, 8, 32, 768))
    p = plan_rmsnorm_bfp(2048, 4096)                           # 64 KiB of x: two passes
    assert (p.herd, p.blocks_per_tile, p.chunk, p.x_passes, p.single, p.xwhole) == (8, 32, 512, 2, False, False)
    assert p.l1_bytes() <= 60 * 1024
    others = [RmsnormBfpPlan(2048, 4096, 8, 32, c) for c in (256, 128)]
    assert all(modeled_seconds(p) <= modeled_seconds(o) for o in others)
    assert plan_rmsnorm_bfp(64, 2048).single is False        # one block per tile: no loop, nothing ping-ponged


# ------------------------------------------------------------------------------------------ kernel paths
@pytest.mark.parametrize("v", VARIANTS, ids=str)
def test_vector_path_is_encode_of_rmsnorm_cc_and_counts_match(v):
    dim, chunk, blocks, offset, xwhole = v
    kern = ext.rmsnorm_bfp_kernel(*v)
    lib = aie_host.load(kern)
    x, w = _data(dim, blocks)
    y, calls = _drive(lambda *a: lib.call(kern.symbol, *a), v, x, w)
    assert y.shape == (blocks, 9 * dim)
    k16 = rmsnorm_kernel(dim, 8 * blocks, offset)
    y16 = aie_host.aligned(np.zeros((8 * blocks, dim), BF16))
    aie_host.load(k16).call(k16.symbol, aie_host.aligned(x), aie_host.aligned(w), y16, EPS)
    np.testing.assert_array_equal(y.view(np.uint8), block_float.encode(y16))
    # against the reference: the bf16 values within one ulp, so each decoded value within a few of its group's steps
    want = block_float.decode(rmsnorm(x, w, rows=8 * blocks, dim=dim, eps=EPS, offset=offset, bfp=1), 8 * blocks, dim)
    got = block_float.decode(y, 8 * blocks, dim)
    assert np.abs(got - want).max() <= 2.0**-5 * np.abs(want).max()
    cost = ext.COSTS[0]
    for (phase, b, c0), counts in calls:
        formula = cost.work(cost.pattern.fullmatch(kern.symbol), [None] * 5 + [phase, 0 if xwhole else b, c0]).counts
        assert Counts._of(formula).host() == {n: c for n, c in counts.items() if c}, (phase, c0)
        if phase:   # one conversion and 72 bytes per block (the whole rows' first call also stores its sums)
            assert counts["bfp16_convert"] == chunk // 8
            assert counts["vstore_bytes"] == 9 * chunk + (8 * 32 * 4 if xwhole and c0 == 0 else 0)


@pytest.mark.parametrize("mutation", [
    (r"::aie::load_v<8>\(p \+ 7 \* kXStride\)", "::aie::load_v<8>(p + 6 * kXStride)"),  # the 8th row of a block
    (r"for \(int kb = 0; kb < kBlocks; \+\+kb\) \{\n    const ::aie::vector<bfloat16, 64> xv",
     "for (int kb = 0; kb < kBlocks - 1; ++kb) {\n    const ::aie::vector<bfloat16, 64> xv"),   # the last block
    (r"if \(c0 \+ kSsCols == RMSNORM_BFP_DIM\) finish_rows\(st, st \+ kAcc \+ kRows \* blk, eps\);\n    if "
     r"\(!RMSNORM_BFP_XWHOLE\)\n      for", "if (c0 == 0) finish_rows(st, st + kAcc + kRows * blk, eps);\n    if "
     "(!RMSNORM_BFP_XWHOLE)\n      for"),                                                  # r before the row's end
    (r"wide\.from_vector\(o\.template to_vector<bfloat16>\(\)\);", "wide = o;"),          # no bf16 rounding first
    (r"norm\(x \+ \(RMSNORM_BFP_XWHOLE \? c0 : 0\), w, st \+ kAcc \+ kRows \* blk, y\);\n  \}\n\}\n\n#else",
     "norm(x, w, st + kAcc + kRows * blk, y);\n  }\n}\n\n#else"),                      # whole rows: chunk 0 always
], ids=["row-7", "last-block", "early-r", "no-bf16-rounding", "whole-rows-offset"])
def test_broken_vector_path_fails(tmp_path, mutation):
    v = (256, 64, 2, 0, 1) if mutation[1].startswith("norm(x, w") else (256, 64, 2, 0, 0)
    text = (SOURCE_DIR / "rmsnorm_bfp.cc").read_text()
    mutated, n = re.subn(mutation[0], mutation[1], text)
    assert n == 1
    src = tmp_path / "rmsnorm_bfp.cc"
    src.write_text(mutated)
    kern = ext.rmsnorm_bfp_kernel(*v)
    x, w = _data(256, 2)
    try:
        lib = aie_host.load(kern, source=src)
        y, _ = _drive(lambda *a: lib.call(kern.symbol, *a), v, x, w)
    except aie_host.AieHostError:
        return
    k16 = rmsnorm_kernel(256, 16)
    y16 = aie_host.aligned(np.zeros((16, 256), BF16))
    aie_host.load(k16).call(k16.symbol, aie_host.aligned(x), aie_host.aligned(w), y16, EPS)
    assert y.shape == (2, 9 * 256)
    assert not np.array_equal(y.view(np.uint8), block_float.encode(y16))


@pytest.fixture(scope="module")
def scalar_lib(tmp_path_factory):
    cxx = require_tool("g++")
    out = tmp_path_factory.mktemp("rmsnorm_bfp_host")
    objs = []
    for v in VARIANTS:
        kern = ext.rmsnorm_bfp_kernel(*v)
        res = subprocess.run(compile_rules.host_compile_command(kern, out, cxx=cxx) + ["-Wall", "-Wextra"],
                             capture_output=True, text=True)
        assert res.returncode == 0 and "warning" not in res.stderr, res.stderr
        objs.append(out / compile_rules.host_object_name(kern))
    so = out / "librmsnorm_bfp.so"
    subprocess.run(compile_rules.host_link_command(objs, so, cxx=cxx), check=True)
    return ctypes.CDLL(str(so))


class _Mem:
    """A memref as the interpreter's numpy models see it."""

    def __init__(self, data, dtype):
        self.data, self.dtype, self.written = data, dtype, False


@pytest.mark.parametrize("v", VARIANTS, ids=str)
def test_scalar_path_equals_the_interpreter_model(scalar_lib, v):
    dim, chunk, blocks, offset, xwhole = v
    kern = ext.rmsnorm_bfp_kernel(*v)
    f = getattr(scalar_lib, kern.symbol)
    f.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_float] + [ctypes.c_int32] * 3
    x, w = _data(dim, blocks, seed=7)

    def c_call(xs, ws, st, yl, eps, phase, b, c0):
        f(xs.ctypes.data, ws.ctypes.data, st.ctypes.data, yl.ctypes.data, eps, phase, b, c0)

    y, _ = _drive(c_call, v, x, w)
    model = ext.rmsnorm_bfp_model(dim, chunk, blocks, offset, xwhole)
    st = _Mem(np.zeros(ext.st_elems(blocks), np.float32), "f32")

    def m_call(xs, ws, _st, yl, eps, phase, b, c0):
        ym = _Mem(yl, "i8")
        model(_Mem(xs.reshape(-1), "bf16"), _Mem(ws, "bf16"), st, ym, eps, phase, b, c0)

    ym, _ = _drive(m_call, v, x, w)
    np.testing.assert_array_equal(y, ym)
    want = rmsnorm(x, w, rows=8 * blocks, dim=dim, eps=EPS, offset=offset, bfp=1)
    got, ref = block_float.decode(y, 8 * blocks, dim), block_float.decode(want, 8 * blocks, dim)
    assert np.abs(got - ref).max() <= 2.0**-5 * np.abs(ref).max()


# ------------------------------------------------------------------------------------------ modules
@pytest.mark.parametrize("rows,dim,offset", [(16, 64, 0), (128, 2048, 0), (128, 3072, 0), (128, 4096, 0),
                                             (16, 256, 1)])
def test_modules_on_emu_and_emu_interp(tmp_path, monkeypatch, rows, dim, offset):
    """The module text on emu-interp (the numpy model of the scalar path, and the vector path through the host aie_api
    at one shape) and on emu (the reference, i8 output stored as bytes). (128, 2048): two blocks per tile, x and w
    in one L1 copy; (128, 3072): two blocks per tile, the 8 whole rows normalised in four chunks; (128, 4096): two
    blocks per tile, eight chunks, two passes."""
    from multi_launch_builder.devices.base import Artifact
    from multi_launch_builder.devices.emu import EmuDevice
    from multi_launch_builder.devices.interp import InterpEmuDevice
    from multi_launch_builder.emulator import air_interp
    text = kernel_text("rmsnorm", rows, dim, EPS, offset=offset, out="bfp16")
    p = plan_rmsnorm_bfp(rows, dim, offset)
    assert (rows, dim) != (128, 2048) or (p.blocks_per_tile, p.chunks, p.single) == (2, 1, True)
    assert (rows, dim) != (128, 3072) or (p.blocks_per_tile, p.chunks, p.xwhole) == (2, 4, True)
    assert (rows, dim) != (128, 4096) or (p.blocks_per_tile, p.chunks, p.x_passes) == (2, 8, 2)
    x, w = _data(dim, rows // 8, seed=11)
    want = rmsnorm(x, w, rows=rows, dim=dim, eps=EPS, offset=offset, bfp=1)
    y = np.zeros((rows // 8, 9 * dim), np.int8)
    air_interp.compile_module(text).run([x, w, y])
    got, ref = block_float.decode(y, rows, dim), block_float.decode(want, rows, dim)
    assert np.abs(got - ref).max() <= 2.0**-5 * np.abs(ref).max() and np.mean(y == want) > 0.97
    if rows == 16:
        monkeypatch.setenv("LLAMA_NPU_EXTERNALS", "aie-host")
        y2 = np.zeros_like(y)
        air_interp.compile_module(text).run([x, w, y2])
        assert np.abs(block_float.decode(y2, rows, dim) - ref).max() <= 2.0**-5 * np.abs(ref).max()
        monkeypatch.delenv("LLAMA_NPU_EXTERNALS")
    path = tmp_path / "rmsnorm_bfp.mlir"
    path.write_text(text)
    emu = EmuDevice()
    handle = emu.load(Artifact(name="rmsnorm_bfp", mlir=path))
    bufs = [emu.alloc(a.nbytes) for a in (x, w, y)]
    for b, a in zip(bufs, (x, w, np.zeros_like(y))):
        emu.write(b, a)
    emu.run(handle, bufs)
    np.testing.assert_array_equal(emu.read(bufs[2], y.shape, np.int8), want)
    dev = InterpEmuDevice()
    handle = dev.load(Artifact(name="rmsnorm_bfp", mlir=path))
    bufs = [dev.alloc(a.nbytes) for a in (x, w, y)]
    for b, a in zip(bufs, (x, w, np.zeros_like(y))):
        dev.write(b, a)
    dev.run(handle, bufs)
    np.testing.assert_array_equal(dev.read(bufs[2], y.shape, np.int8), y)


HW_SHAPES = [(2048, 576), (2048, 2048), (2048, 3072), (2048, 4096), (64, 2048), (256, 2048), (1024, 2048),
             (64, 576), (2048, 2048, 1)]


@pytest.mark.parametrize("shape", HW_SHAPES, ids=str)
def test_hardware_model_accepts_prefill_shapes(shape):
    """`llama-npu hw-check`'s analysis (the stack the preset raises, as for the bf16 rmsnorm) at the prefill buckets
    of SmolLM2-135M, Llama-3.2-1B / 3B and Llama-3.1-8B widths; the planner's closed form is the analyzer's time (a
    `single` / `xwhole` plan's: plus its compute, which the analyzer hides under the streams); against the bf16
    module: its time
    when x is read once, about twice it (x twice) otherwise."""
    from kernel_builder.hw import analyze_module
    from kernel_builder.hw.cost import launch_cost
    from kernel_builder.hw.tune import preset_for_kernels
    rows, dim, *o = shape
    offset = o[0] if o else 0
    text = kernel_text("rmsnorm", rows, dim, EPS, offset=offset, out="bfp16")
    rep = analyze_module(text, preset=preset_for_kernels([text]))
    assert rep.ok, rep.first_violation()
    c = launch_cost(rep.launches[0].work)
    p = plan_rmsnorm_bfp(rows, dim, offset)
    want = c.dma_s + c.compute_s if p.serial else max(c.compute_s, c.dma_s)
    assert modeled_seconds(p) == pytest.approx(want, rel=0.03)
    bf = kernel_text("rmsnorm", rows, dim, EPS, offset=offset)
    cb = launch_cost(analyze_module(bf, preset=preset_for_kernels([bf])).launches[0].work)
    assert c.total_s <= (1.0 if p.x_passes == 1 else 2.05) * cb.total_s


def test_hardware_model_rejects_a_plan_that_does_not_fit(monkeypatch):
    """A deliberately broken plan (the 8 rows of 2048 columns whole and ping-ponged: 2 x 32 KiB of x) builds a module
    the hardware model rejects on its L1."""
    from kernel_builder.hw import analyze_module
    from kernel_builder.hw.tune import preset_for_kernels
    from kernel_builder.rmsnorm import bfp_builder
    monkeypatch.setattr(bfp_builder, "plan_rmsnorm_bfp", lambda r, d, o=0: RmsnormBfpPlan(r, d, 8, 32, d, o))
    text = bfp_builder.build_bfp(2048, 2048, EPS)
    rep = analyze_module(text, preset=preset_for_kernels([text]))
    assert not rep.ok and {v.resource for v in rep.violations} == {"L1 bytes"}


@pytest.mark.parametrize("rows,dim", [(2048, 2048), (64, 576), (2048, 3072), (2048, 4096)])
def test_builder_objects_on_the_host_aie_api(rows, dim):
    """The objects the builder links at Llama-3.2-1B / SmolLM2-135M / Llama-3.2-3B prefill shapes, driven by
    kernel_builder.aie_host_runs like every other family (every call of one tile): within the bound, and every
    call's counts equal the descriptor's (tests/test_kernel_counts)."""
    from kernel_builder import aie_host_runs as runs
    from kernel_builder.air_module import read
    from tests.test_kernel_counts import _check, recorded_calls
    (obj,) = read(kernel_text("rmsnorm", rows, dim, EPS, out="bfp16")).link_objects
    assert runs.mismatch(runs.run(obj, np.random.default_rng(3))) == ""
    _check(obj, recorded_calls(obj))
