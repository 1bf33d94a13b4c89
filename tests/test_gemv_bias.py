"""The `gemv_bias` kernel (y = W x + b: a decode projection and its bias in ONE launch; Qwen2's q/k/v biases):
the numpy reference, the AIE2P vector path on the host aie_api at Qwen2.5-1.5B's q/k/v shapes and a K-chunked one
(vs the reference, its instruction counts vs the cost descriptor, an off-by-one in the bias index caught), the
module on the AIR interpreter (emu-interp) vs the reference emulator, and the lowering: Qwen2's decode modules
fuse each projection with its bias_add (prefill and 4-bit decode keep the two launches), within the hardware
model."""
from __future__ import annotations

import re

import numpy as np
import pytest

from kernel_builder import aie_host
from kernel_builder import aie_host_runs as runs
from kernel_builder.gemv.plan import plan_gemv
from kernel_builder.numerics import BF16, to_bf16
from kernel_builder.reference import KERNELS
from tooling import require_tool

# Qwen2.5-1.5B: q (1536 x 1536), k / v (256 x 1536); a K-chunked plan (4 chunks of one row per step)
SHAPES = [(1536, 1536), (256, 1536), (256, 16384)]


def _obj(m: int, k: int) -> str:
    p = plan_gemv(m, k, bias=True)
    return f"mvb_k{k}_c{p.k_chunk}_m{p.tile_m}_r{p.rows_per_tile}.o"


def test_reference_is_one_rounding_of_sum_plus_bias():
    rng = np.random.default_rng(0)
    w, x, b = (to_bf16(rng.standard_normal(s).astype(np.float32)) for s in ((64, 96), (96,), (64,)))
    got = KERNELS["gemv_bias"](w, x, b, m=64, k=96).reshape(-1)
    exact = w.astype(np.float64) @ x.astype(np.float64) + b.astype(np.float64)
    np.testing.assert_array_equal(got, to_bf16((w.astype(np.float32) @ x.astype(np.float32)) + b.astype(np.float32)))
    assert np.abs(got.astype(np.float64) - exact).max() <= 2.0**-7 * np.abs(exact).max()
    plain = KERNELS["gemv"](w, x, m=64, k=96).reshape(-1).astype(np.float64)
    assert np.abs(got.astype(np.float64) - plain).max() > 0.5             # the bias is really added


@pytest.fixture(scope="module")
def built():
    require_tool("g++")
    aie_host.build_all([runs.kernel_of(_obj(m, k)) for m, k in SHAPES])


@pytest.mark.parametrize("m,k", SHAPES)
def test_vector_path_matches_reference_and_counts(built, m, k):
    from tests.test_kernel_counts import _check, recorded_calls

    obj = _obj(m, k)
    r = runs.run(obj, np.random.default_rng(m + k))
    assert not runs.mismatch(r), f"{obj}: {runs.mismatch(r)}"
    _check(obj, recorded_calls(obj))


def test_off_by_one_bias_index_fails(built, tmp_path):
    from tests.test_aie_host_strict import _mutant

    obj = _obj(256, 16384)
    lib = _mutant(tmp_path, obj, "gemv.cc", r"GEMV_PLUS_BIAS\(row \+ m\)", "GEMV_PLUS_BIAS(row + m + 1)")
    assert runs.mismatch(runs.run(obj, np.random.default_rng(5), lib)), "a shifted bias row went unnoticed"
    lib = _mutant(tmp_path, obj, "gemv.cc", r"x\[GEMV_K \+ \(i\)\]", "x[GEMV_K - 1 + (i)]")
    assert runs.mismatch(runs.run(obj, np.random.default_rng(5), lib)), "the bias read from x went unnoticed"


@pytest.mark.parametrize("m,k", [(128, 256), (64, 2048)])
def test_module_on_the_interpreter(tmp_path, m, k):
    """The builder's module (x and each tile's bias rows on one stream into one L1 buffer) run by the AIR
    interpreter equals the reference emulator; a bias put at the wrong rows is noticed."""
    from kernel_builder.gemv_bias import builder
    from tests.test_air_interp import _check_mutation_detected, _inputs, _run, _shapes_of, _artifact, _assert_close
    from multi_launch_builder.devices.emu import EmuDevice
    from multi_launch_builder.devices.interp import InterpEmuDevice

    text = builder.build(m, k)
    art = _artifact(tmp_path, "mvb", text)
    data = _inputs(_shapes_of(text), seed=m)
    ref = _run(EmuDevice(), art, data)
    _assert_close(_run(InterpEmuDevice(), art, data), ref, f"gemv_bias {m}x{k}")
    if (m, k) == (128, 256):   # 8 rows per tile: tile (0, 0)'s bias put reads tile (0, 1)'s rows
        assert plan_gemv(m, k, bias=True).rows_per_tile == 8 and "%c8 = arith.constant 8" in text
        mutated, n = re.subn(r"\(%la_2\[%c0, %c0\] \[%c1_1, %c8\]", "(%la_2[%c0, %c8] [%c1_1, %c8]", text, count=1)
        assert n == 1, "the first tile's bias put is not in the builder output"
        _check_mutation_detected(tmp_path, "mvb", text, mutated, seed=3)


def _launch_kinds(decl) -> list[str]:
    return [la.build.args[0] for la in decl.launches]


def test_qwen2_decode_fuses_the_bias():
    from llama_npu.models import family_model
    from kernel_builder.hw import analyze_module
    from multi_launch_builder.stitcher import stitch

    m = family_model("qwen2.5-1.5b", 2)
    layer = m.decode(1024).decls[0]
    kinds = _launch_kinds(layer)
    assert "bias_add" not in kinds and kinds.count("gemv_bias") == 3 and kinds.count("gemv") == 4
    assert {a.name: a.shape for a in layer.args if a.name in ("bq", "bk", "bv")} == \
        {"bq": (1, 1536), "bk": (1, 256), "bv": (1, 256)}          # the prefill bias_add's [1, out] statics
    assert next(a for a in layer.args if a.name == "v_new").state == "v_cache"   # v + bias into the cache
    rep = analyze_module(stitch(layer), layer.name)
    assert rep.ok, rep.first_violation()
    assert _launch_kinds(m.prefill(64).decls[0]).count("bias_add") == 3   # GEMM prefill: the separate launch
    q4 = family_model("qwen2.5-1.5b", 2)
    q4.weights = "q4"
    q4.__dict__.pop("graph", None)
    assert _launch_kinds(q4.decode(None).decls[0]).count("bias_add") == 3   # the 4-bit GEMV: not fused
