"""The decode GEMV on weights at rest in block float (`gemv_bfp`, `gemv_bfp_bias`): the numpy reference against a
plain numpy model of its numerics, the C++ scalar path and the AIE2P vector path (host aie_api, the block-float
matrix unit) bit for bit against the reference on bytes made by kernel_builder.block_float.encode, their counts
equal to the cost descriptor, a broken kernel that fails, both modules on emu and emu-interp, the hardware model at
the Llama-3.2-1B and SmolLM2-135M decode shapes, the modeled weight-stream bound, and bad inputs.

Tolerance: the three paths are bit-exact with the reference (the same block-float rounding of x, exact 8-term block
dot products, the same f32 accumulation order). Against the bf16 GEMV on the same decoded weights the block-float
rounding of x costs up to ~1 % of max|y| (checked below with a 2^-5 bound)."""
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
from kernel_builder.gemv_bfp import external as bfp_ext
from kernel_builder.gemv_bfp.plan import plan_gemv_bfp
from kernel_builder.gemv_bfp.reference import gemv_bfp
from kernel_builder.gemv_bfp_bias.reference import gemv_bfp_bias
from kernel_builder.instr_counts import Counts
from kernel_builder.numerics import BF16, to_bf16, to_bfp16ebs8
from kernel_builder.registry import kernel_text

# (k, kc, tile_m, rows, bias): whole rows, two block rows per step, K chunks carried in acc, with and without bias
VARIANTS = [(64, 64, 8, 16, False), (256, 256, 16, 32, False), (256, 64, 8, 16, True), (192, 96, 16, 32, True)]


def _weights(rng, m, k, scale=1.0):
    w = to_bf16((rng.standard_normal((m, k)) * scale).astype(np.float32))
    w[0, :8] = 0.0                                   # an all-zero group (E = 0)
    return w, block_float.encode(w)


def _naive(w_bytes, x, b, m, k):
    """The stated numerics, written plainly: per row, per K block, the exact dot of the block-float x with the
    decoded weight, added to an f32 sum; the bias in f32; one bf16 rounding."""
    wf = block_float.decode(w_bytes, m, k).astype(np.float64)
    xq = to_bfp16ebs8(np.asarray(x, np.float32)).astype(np.float64)
    y = np.zeros(m, np.float32)
    for i in range(m):
        s = np.float32(0.0)
        for j in range(0, k, 8):
            s = np.float32(np.float64(s) + float(np.dot(wf[i, j:j + 8], xq[j:j + 8])))
        y[i] = s + (np.float32(b[i]) if b is not None else np.float32(0.0))
    return to_bf16(y)


def _bits(a):
    return np.asarray(a).astype(BF16).view(np.uint16).reshape(-1)


# ------------------------------------------------------------------------------------------ reference
def test_reference_is_the_stated_numerics_and_close_to_bf16():
    rng = np.random.default_rng(1)
    m, k = 24, 128
    w, wb = _weights(rng, m, k)
    x = to_bf16(rng.standard_normal(k).astype(np.float32))
    x[8:16] = to_bf16(np.float32(1e-3) * x[8:16])     # a small group: its own exponent
    b = to_bf16(rng.standard_normal(m).astype(np.float32))
    np.testing.assert_array_equal(_bits(gemv_bfp(wb, x, m=m, k=k)), _bits(_naive(wb, x, None, m, k)))
    np.testing.assert_array_equal(_bits(gemv_bfp_bias(wb, x, b, m=m, k=k)), _bits(_naive(wb, x, b, m, k)))
    # int8 bytes (the device's memref type) read the same
    np.testing.assert_array_equal(_bits(gemv_bfp(wb.view(np.int8), x, m=m, k=k)), _bits(gemv_bfp(wb, x, m=m, k=k)))
    exact = block_float.quantize(w).astype(np.float64) @ x.astype(np.float64)
    err = np.abs(gemv_bfp(wb, x, m=m, k=k).astype(np.float64).reshape(-1) - exact)
    assert err.max() <= 2.0**-5 * np.abs(exact).max()


def test_bad_inputs_are_one_clear_error():
    rng = np.random.default_rng(2)
    w, wb = _weights(rng, 16, 64)
    x = to_bf16(rng.standard_normal(64).astype(np.float32))
    with pytest.raises(ValueError, match=r"gemv_bfp: w must be the block-float bytes .* got bfloat16"):
        gemv_bfp(w, x, m=16, k=64)
    with pytest.raises(ValueError, match=r"gemv_bfp: w has 1152 bytes, \[16, 128\] in block float takes 2304"):
        gemv_bfp(wb, to_bf16(np.zeros(128, np.float32)), m=16, k=128)
    with pytest.raises(ValueError, match=r"gemv_bfp_bias: input b has 8 elements"):
        gemv_bfp_bias(wb, x, x[:8], m=16, k=64)
    with pytest.raises(ValueError, match=r"gemv_bfp: m=20 must be a multiple of 8"):
        kernel_text("gemv_bfp", 20, 64)
    with pytest.raises(ValueError, match=r"gemv_bfp_bias: k=60 must be a multiple of 8"):
        kernel_text("gemv_bfp_bias", 64, 60)
    with pytest.raises(ValueError, match=r"gemv_bfp: tile_m=12 must be a multiple of 8"):
        bfp_ext.gemv_bfp_kernel(64, 64, 12, 24)


# ------------------------------------------------------------------------------------------ kernel paths
def _inputs(v, seed=5):
    k, kc, tm, rows, bias = v
    rng = np.random.default_rng(seed)
    w, wb = _weights(rng, rows, k, 0.05)
    x = to_bf16(rng.standard_normal(k).astype(np.float32))
    b = to_bf16(rng.standard_normal(rows).astype(np.float32))
    want = gemv_bfp_bias(wb, x, b, m=rows, k=k) if bias else gemv_bfp(wb, x, m=rows, k=k)
    return wb, (np.concatenate([x, b]) if bias else x), want.reshape(-1)


def _steps(wb, v):
    """(step bytes, row, k0) in the builder's order: block rows of tile_m rows, each K chunk's bytes."""
    k, kc, tm, rows, _ = v
    for r in range(0, rows, tm):
        for k0 in range(0, k, kc):
            yield np.ascontiguousarray(wb[r // 8:(r + tm) // 8, 9 * k0:9 * (k0 + kc)]).view(np.int8).reshape(-1), r, k0


@pytest.fixture(scope="module")
def scalar_lib(tmp_path_factory):
    cxx = require_tool("g++")
    out = tmp_path_factory.mktemp("gemv_bfp_host")
    objs = []
    for v in VARIANTS:
        kern = bfp_ext.gemv_bfp_kernel(*v)
        res = subprocess.run(compile_rules.host_compile_command(kern, out, cxx=cxx) + ["-Wall", "-Wextra"],
                             capture_output=True, text=True)
        assert res.returncode == 0 and "warning" not in res.stderr, res.stderr
        objs.append(out / compile_rules.host_object_name(kern))
    so = out / "libgemv_bfp.so"
    subprocess.run(compile_rules.host_link_command(objs, so, cxx=cxx), check=True)
    return ctypes.CDLL(str(so))


@pytest.mark.parametrize("v", VARIANTS)
def test_scalar_path_matches_reference(scalar_lib, v):
    wb, x, want = _inputs(v)
    k, kc, tm, rows, _ = v
    f = getattr(scalar_lib, bfp_ext.gemv_bfp_kernel(*v).symbol)
    f.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_int32] * 2
    y, acc = np.zeros(rows, BF16), np.zeros(tm, np.float32)
    for blk, r, k0 in _steps(wb, v):
        f(blk.ctypes.data, x.ctypes.data, acc.ctypes.data, y.ctypes.data, r, k0)
    np.testing.assert_array_equal(_bits(y), _bits(want))


def _vector_run(v, lib=None, seed=5):
    kern = bfp_ext.gemv_bfp_kernel(*v)
    lib = lib or aie_host.load(kern)
    wb, x, want = _inputs(v, seed)
    k, kc, tm, rows, bias = v
    xa, y, acc = aie_host.aligned(x), aie_host.aligned(np.zeros(rows, BF16)), aie_host.aligned(np.zeros(tm, np.float32))
    calls = []
    for blk, r, k0 in _steps(wb, v):
        calls.append((k0, lib.call(kern.symbol, aie_host.aligned(blk), xa, acc, y, r, k0)))
    return y, want, calls


@pytest.mark.parametrize("v", VARIANTS)
def test_vector_path_matches_reference_and_its_counts(v):
    y, want, calls = _vector_run(v)
    np.testing.assert_array_equal(_bits(y), _bits(want))
    k, kc, tm, rows, bias = v
    kern = bfp_ext.gemv_bfp_kernel(*v)
    cost = (bfp_ext.COSTS if not bias else __import__("kernel_builder.gemv_bfp_bias.external",
                                                        fromlist=["COSTS"]).COSTS)[0]
    for k0, counts in calls:
        assert counts["mmul_bfp16_8x8x8"] == (tm // 8) * (kc // 8)           # one block-float mmul per W block
        assert counts["bfp16_convert"] == kc // 8                             # x converted once per K block
        formula = cost.work(cost.pattern.fullmatch(kern.symbol), [None] * 5 + [k0]).counts
        assert Counts._of(formula).host() == {n: c for n, c in counts.items() if c}


@pytest.mark.parametrize("mutation", [
    (r"for \(; kb < kKB; \+\+kb\)", "for (; kb < kKB - 1; ++kb)"),
    (r"w \+ \(kNB > 1 \? kRowBytes : 0\)", "w + (kNB > 1 ? kRowBytes - 72 : 0)"),
    (r"::aie::load_v<8>\(xc \+ kBlk \* kb\)", "::aie::load_v<8>(xc + kBlk * kb + 8)"),
], ids=["k-loop", "second-block-row", "x-block"])
def test_broken_vector_path_fails(tmp_path, mutation):
    v = (256, 64, 16, 32, True)
    text = (SOURCE_DIR / "gemv_bfp.cc").read_text()
    mutated, n = re.subn(mutation[0], mutation[1], text)
    assert n == 1
    src = tmp_path / "gemv_bfp.cc"
    src.write_text(mutated)
    try:
        y, want, _ = _vector_run(v, aie_host.load(bfp_ext.gemv_bfp_kernel(*v), source=src))
    except aie_host.AieHostError:
        return                                        # the host aie_api rejected it (an out-of-range access)
    assert not np.array_equal(_bits(y), _bits(want))


def test_forgotten_rounding_mode_is_caught(tmp_path):
    """Without set_rounding(conv_even) x's block-float conversion and the output rounding go toward -inf."""
    v = VARIANTS[0]
    text = (SOURCE_DIR / "gemv_bfp.cc").read_text()
    mutated, n = re.subn(r"  ::aie::set_rounding\(::aie::rounding_mode::conv_even\);\n", "", text)
    assert n == 1
    src = tmp_path / "gemv_bfp.cc"
    src.write_text(mutated)
    y, want, _ = _vector_run(v, aie_host.load(bfp_ext.gemv_bfp_kernel(*v), source=src))
    assert not np.array_equal(_bits(y), _bits(want))


# ------------------------------------------------------------------------------------------ modules
def _module_data(m, k, bias, seed=9):
    rng = np.random.default_rng(seed)
    _, wb = _weights(rng, m, k, 0.05)
    x = to_bf16(rng.standard_normal((1, k)).astype(np.float32))
    b = to_bf16(rng.standard_normal((1, m)).astype(np.float32))
    want = gemv_bfp_bias(wb, x, b, m=m, k=k) if bias else gemv_bfp(wb, x, m=m, k=k)
    return ([wb.view(np.int8), x, b] if bias else [wb.view(np.int8), x]), want


@pytest.mark.parametrize("m,k,bias", [(128, 192, False), (64, 256, True), (128, 8192, True)])
def test_modules_on_emu_and_emu_interp(tmp_path, m, k, bias, monkeypatch):
    """The module text itself (emu-interp, the numpy model of the scalar path and then the vector path through the
    host aie_api) and the launch program (emu, the reference): y equals the reference bit for bit; every tile
    stores its rows once; (128, 8192) carries f32 partial sums over 4 K chunks."""
    from multi_launch_builder.devices.base import Artifact
    from multi_launch_builder.devices.emu import EmuDevice
    from multi_launch_builder.devices.interp import InterpEmuDevice
    from multi_launch_builder.emulator import air_interp
    kind = "gemv_bfp_bias" if bias else "gemv_bfp"
    text = kernel_text(kind, m, k)
    plan = plan_gemv_bfp(m, k, bias)
    assert (m, k) != (128, 8192) or plan.k_steps == 4
    inputs, want = _module_data(m, k, bias)
    y = np.zeros((1, m), BF16)
    stats = air_interp.compile_module(text).run([*inputs, y])
    assert stats.tiles == plan.tiles and stats.dma_bytes == 2 * m
    np.testing.assert_array_equal(_bits(y), _bits(want))
    if k <= 256:
        monkeypatch.setenv("LLAMA_NPU_EXTERNALS", "aie-host")
        y2 = np.zeros((1, m), BF16)
        air_interp.compile_module(text).run([*inputs, y2])
        np.testing.assert_array_equal(_bits(y2), _bits(want))
        monkeypatch.delenv("LLAMA_NPU_EXTERNALS")
    path = tmp_path / f"{kind}.mlir"
    path.write_text(text)
    for device in (EmuDevice(), InterpEmuDevice()):
        handle = device.load(Artifact(name=kind, mlir=path))
        bufs = []
        for a in [*inputs, np.zeros((1, m), BF16)]:
            bufs.append(device.alloc(a.nbytes))
            device.write(bufs[-1], a)
        device.run(handle, bufs)
        np.testing.assert_array_equal(_bits(device.read(bufs[-1], (1, m), BF16)), _bits(want))


def _lm_head_rows(vocab, hidden):
    from kernel_builder.gemv.plan import plan_lm_head
    return plan_lm_head(vocab, hidden).part_rows


# Llama-3.2-1B decode (q, k/v, gate/up, down with the residual as bias, o with bias, an LM-head partition of the
# 128256 vocabulary, which is also the interleaved gate/up weight's 16384 rows), SmolLM2-135M's (with its
# interleaved gate/up, 3072 rows) and Llama-3.2-3B's
HW_SHAPES = [("gemv_bfp", 2048, 2048), ("gemv_bfp", 512, 2048), ("gemv_bfp", 8192, 2048),
             ("gemv_bfp_bias", 2048, 8192), ("gemv_bfp_bias", 2048, 2048), ("gemv_bfp", "lm", 2048),
             ("gemv_bfp", 576, 576), ("gemv_bfp", 192, 576), ("gemv_bfp", 1536, 576), ("gemv_bfp_bias", 576, 1536),
             ("gemv_bfp_bias", 576, 576), ("gemv_bfp", "lm", 576), ("gemv_bfp", 3072, 576),
             ("gemv_bfp", 3072, 3072), ("gemv_bfp", 1024, 3072), ("gemv_bfp", 16384, 3072),
             ("gemv_bfp_bias", 3072, 8192)]


@pytest.mark.parametrize("kind,m,k", HW_SHAPES)
def test_hardware_model_accepts_decode_shapes_and_weight_stream_bounds_them(kind, m, k):
    from kernel_builder.hw import analyze_module
    from kernel_builder.hw.cost import launch_cost, shim_seconds
    m = _lm_head_rows(128256 if k == 2048 else 49152, k) if m == "lm" else m
    rep = analyze_module(kernel_text(kind, m, k))
    assert rep.ok, rep.first_violation()
    work = rep.launches[0].work
    cost = launch_cost(work)
    plan = plan_gemv_bfp(m, k, kind.endswith("bias"))
    assert sum(f.bytes for f in work.flows if f.direction == "MM2S") == plan.tiles * plan.stream_bytes()
    assert sum(f.bytes for f in work.flows if f.direction != "MM2S") == 2 * m       # y, stored once
    # the 7/8 idle mmul does not matter: the launch waits on its weight stream (counted compute well below)
    assert cost.bound == "DMA" and cost.compute_s < 0.25 * cost.dma_s
    if m * k >= 2048 * 2048:
        # 9/16 of the bf16 GEMV's weight bytes on the shim
        bf16 = analyze_module(kernel_text(kind.replace("gemv_bfp", "gemv"), m, k)).launches[0].work
        assert shim_seconds(work.flows) < 0.6 * shim_seconds(bf16.flows)


def test_gemv_texts_do_not_mention_block_float():
    """gemv's builder is shared (gemv.builder.emit): its own modules keep their bf16 weight stream."""
    t = kernel_text("gemv", 2048, 2048)
    assert "xi8" not in t and "@gemv_in" in t and "gemvbfp" not in t
    assert "memref<256x18432xi8>" in kernel_text("gemv_bfp", 2048, 2048)


def test_host_kernel_gives_the_numpy_bits():
    """The emulator's host GEMV on the stored bytes (external_kernels/host/gemv_bfp_host.cc) and the numpy path of
    the reference agree bit for bit: tiny and zero x groups, a NaN group, and an LM-head-sized weight run in row
    blocks on the thread pool."""
    from external_kernels import host_build
    from kernel_builder.gemv_bfp.reference import gemv_bfp_f32
    if host_build.library() is None:
        pytest.skip("no host kernels")
    rng = np.random.default_rng(21)
    for m, k in ((40, 96), (4096, 576)):
        _, wb = _weights(rng, m, k, 0.05)
        x = to_bf16(rng.standard_normal(k).astype(np.float32))
        x[:8] = to_bf16(np.float32(1e-30) * x[:8])
        x[8:16] = 0.0
        for xx in (x, np.where(np.arange(k) == 20, np.float32(np.nan), x.astype(np.float32))):
            got = gemv_bfp_f32(wb, xx, m=m, k=k)
            want = gemv_bfp_f32(wb, xx, m=m, k=k, host=False)
            np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("kind,m,k", [("gemv_bfp", 2048, 2048), ("gemv_bfp_bias", 2048, 8192),
                                      ("gemv_bfp", 6144, 576)])
def test_builder_objects_on_the_host_aie_api(kind, m, k):
    """The objects the builder links at Llama-3.2-1B / SmolLM2-135M shapes, driven by kernel_builder.aie_host_runs
    like every other family: bit exact, and every call's counts equal the descriptor's (tests/test_kernel_counts)."""
    from kernel_builder import aie_host_runs as runs
    from kernel_builder.air_module import read
    from tests.test_kernel_counts import _check, recorded_calls
    (obj,) = read(kernel_text(kind, m, k)).link_objects
    assert runs.mismatch(runs.run(obj, np.random.default_rng(3))) == ""
    _check(obj, recorded_calls(obj))


def _host_builds(tmp_path):
    """The native host library, and this kernel alone without its AVX-512 path (AVX2 where the CPU has it) and
    with neither (-DLLAMA_NPU_SCALAR_ONLY)."""
    from external_kernels import host_build
    native = host_build.library()
    if native is None:
        pytest.skip("no host kernels")
    src = [p for p in host_build.SOURCES if p.name == "gemv_bfp_host.cc"]
    out = {"native": native}
    for name, flag in (("no-avx512", "-DLLAMA_NPU_NO_AVX512"), ("scalar", "-DLLAMA_NPU_SCALAR_ONLY")):
        flags = host_build.FLAGS + (flag,)
        lib = ctypes.CDLL(str(host_build.build_library(require_tool("g++"), tmp_path, f"bfp_{name}", src,
                                                       [flags + host_build.NATIVE_FLAGS, flags])))
        lib.llama_npu_gemv_bfp.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_int] * 4
        out[name] = lib
    return out


def test_host_kernel_paths_on_edge_inputs(tmp_path):
    """The AVX-512 and AVX2 paths (exact f32 fma where every scale is a normal f32), their exact fallback, and the
    scalar build, against the numpy bits: k not a multiple of 64, all-zero groups (E = 0), a block row with tiny weights
    (E = 0, nonzero mantissas), subnormal / zero / huge / inf / NaN x groups, arbitrary bytes (E from 0 to 253,
    sums that overflow to inf), and row ranges that start mid-weight."""
    from kernel_builder.gemv_bfp import host as bfp_host
    from kernel_builder.gemv_bfp.reference import gemv_bfp_f32
    libs = _host_builds(tmp_path)
    rng = np.random.default_rng(33)
    m, k = 48, 200
    w, _ = _weights(rng, m, k, 0.05)
    w[16:24, 40:48] = to_bf16(np.float32(3e-39) * rng.standard_normal((8, 8)).astype(np.float32))
    encoded = block_float.encode(w).view(np.uint8).reshape(m // 8, -1)
    arbitrary = rng.integers(0, 256, size=encoded.shape, dtype=np.uint8)   # E <= 253: the decode stays finite
    arbitrary.reshape(m // 8, k // 8, 8, 9)[..., 0] = rng.integers(0, 254, size=(m // 8, k // 8, 8))
    high = arbitrary.copy()
    high.reshape(m // 8, k // 8, 8, 9)[..., 0] = rng.integers(200, 243, size=(m // 8, k // 8, 8))
    x = to_bf16(rng.standard_normal(k).astype(np.float32))
    xs = {"plain": x, "zeros": np.zeros(k, np.float32),
          "subnormal group": np.where(np.arange(k) // 8 == 3, np.float32(2e-39), x),
          "all subnormal": to_bf16(np.float32(1e-39) * x), "huge": to_bf16(np.float32(2.0**40) * x),
          "inf group": np.where(np.arange(k) == 77, np.float32(-np.inf), x),
          "nan group": np.where(np.arange(k) == 199, np.float32(np.nan), x)}
    for wname, wb in (("encoded", encoded), ("arbitrary", arbitrary), ("high E", high)):
        for xname, xx in xs.items():
            want = gemv_bfp_f32(wb, xx, m=m, k=k, host=False)
            for lname, lib in libs.items():
                got = bfp_host.run(lib, wb, xx, m=m, k=k)
                np.testing.assert_array_equal(got, want, err_msg=f"{lname}: {wname} w, {xname} x")
                part = np.full(m, 7.0, np.float32)
                assert lib.llama_npu_gemv_bfp(wb.ctypes.data, np.asarray(xx, np.float32).ctypes.data,
                                              part.ctypes.data, m, k, 16, 40) == 0
                np.testing.assert_array_equal(part[16:40], want[16:40])
                assert (part[:16] == 7.0).all() and (part[40:] == 7.0).all()
    assert np.isinf(gemv_bfp_f32(high, xs["huge"], m=m, k=k, host=False)).any()
