"""The `gemv_bias` kernel (y = W x + b: a decode projection and its bias in ONE launch; Qwen2's q/k/v biases) and its
4-bit twin `gemv_q4_bias`:
the numpy reference, the AIE2P vector path on the host aie_api at Qwen2.5-1.5B's q/k/v shapes and a K-chunked one
(vs the reference, its instruction counts vs the cost descriptor, an off-by-one in the bias index caught), the
module on the AIR interpreter (emu-interp) vs the reference emulator, and the lowering: Qwen2's decode modules
fuse each projection with its bias_add (prefill and 4-bit decode keep the two launches), within the hardware
model (bf16 and 4-bit weights)."""
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


# ---------------------------------------------------------------------------------------------- 4-bit weights
Q4_VARIANTS = [(1536, 32, 1, 4, 96), (256, 32, 0, 3, 3)]   # (k, group, mins, tile_m, rows)


def _q4_run(v, lib=None, seed=5):
    from kernel_builder.gemv_q4.external import gemv_q4_kernel
    from tests.test_gemv_q4 import _random_q4

    k, group, mins, tm, rows = v
    kern = gemv_q4_kernel(*v, bias=True)
    lib = lib or aie_host.load(kern)
    rng = np.random.default_rng(seed)
    p, *_ = _random_q4(rng, rows, k, group, mins)
    x, b = (to_bf16(rng.standard_normal(n).astype(np.float32)) for n in (k, rows))
    y, counts = aie_host.aligned(np.zeros(rows, BF16)), {}
    xb = aie_host.aligned(np.concatenate([x, b]))
    for r in range(0, rows, tm):
        counts = lib.call(kern.symbol, aie_host.aligned(np.ascontiguousarray(p[r:r + tm])), xb, y, r)
    want = KERNELS["gemv_q4_bias"](p, x, b, m=rows, k=k, group=group, mins=mins).reshape(-1)
    return y, want, counts, kern


@pytest.mark.parametrize("v", Q4_VARIANTS)
def test_q4_vector_path_matches_reference_and_counts(v, tmp_path):
    from kernel_builder.instr_counts import Counts
    from kernel_builder.gemv_q4_bias.external import COSTS
    from tests.test_gemv_q4 import _close

    require_tool("g++")
    y, want, counts, kern = _q4_run(v)
    _close(y, want, "gemv_q4_bias")
    cost = COSTS[0]
    assert Counts._of(cost.work(cost.pattern.fullmatch(kern.symbol), []).counts).host() == \
        {k: n for k, n in counts.items() if n}
    from external_kernels.paths import SOURCE_DIR
    mutated, n = re.subn(r"Q4_PLUS_BIAS\(row \+ m\)", "Q4_PLUS_BIAS(row + m + 1)", (SOURCE_DIR / "gemv_q4.cc").read_text())
    assert n == 2
    (tmp_path / "gemv_q4.cc").write_text(mutated)
    y, want, _, _ = _q4_run(v, aie_host.load(kern, source=tmp_path / "gemv_q4.cc"))
    with pytest.raises(AssertionError):
        _close(y, want, "mutant")


def test_q4_module_on_the_interpreter():
    from multi_launch_builder.emulator import air_interp
    from kernel_builder.registry import kernel_text
    from tests.test_gemv_q4 import _close, _random_q4

    m, k = 256, 512
    rng = np.random.default_rng(2)
    p, *_ = _random_q4(rng, m, k, 32, 1)
    x, b = (to_bf16(rng.standard_normal((1, n)).astype(np.float32)) for n in (k, m))
    y = np.zeros((1, m), BF16)
    air_interp.compile_module(kernel_text("gemv_q4_bias", m, k, 32, 1)).run([p.view(np.int8), x, b, y])
    _close(y, KERNELS["gemv_q4_bias"](p, x, b, m=m, k=k, group=32, mins=1), "interp")


def _launch_kinds(decl) -> list[str]:
    return [la.build.args[0] for la in decl.launches]


def test_qwen2_decode_fuses_the_bias():
    from llama_npu.models import family_model
    from kernel_builder.hw import analyze_module
    from multi_launch_builder.stitcher import stitch

    m = family_model("qwen2.5-1.5b", 2)
    layer = m.decode(1024).decls[0]
    kinds = _launch_kinds(layer)
    # q/k/v with their biases, o_proj and down with the residual add as the bias epilogue; gemv: the interleaved
    # gate/up projection
    assert "bias_add" not in kinds and kinds.count("gemv_bias") == 5 and kinds.count("gemv") == 1
    assert {a.name: a.shape for a in layer.args if a.name in ("bq", "bk", "bv")} == \
        {"bq": (1, 1536), "bk": (1, 256), "bv": (1, 256)}          # the prefill bias_add's [1, out] statics
    assert next(a for a in layer.args if a.name == "v_new").state == "v_cache"   # v + bias into the cache
    rep = analyze_module(stitch(layer), layer.name)
    assert rep.ok, rep.first_violation()
    assert _launch_kinds(m.prefill(64).decls[0]).count("bias_add") == 3   # GEMM prefill: the separate launch
    from llama_npu.models import FAMILIES
    from llama_npu.models.qwen2 import QWEN25_1P5B
    import dataclasses
    q4 = FAMILIES["Qwen2ForCausalLM"](dataclasses.replace(QWEN25_1P5B, n_layers=2), "q4")
    q4_layer = q4.decode(1024).decls[0]
    kinds = _launch_kinds(q4_layer)
    assert "bias_add" not in kinds and kinds.count("gemv_q4_bias") == 5      # the 4-bit GEMV fuses it too
    assert {a.name: a.dtype for a in q4_layer.args if a.name in ("wq_q4", "bq")} == {"wq_q4": "i8", "bq": "bf16"}
    rep = analyze_module(stitch(q4_layer), q4_layer.name)
    assert rep.ok, rep.first_violation()


def test_qwen2_q4_engine_equals_bf16_engine_with_fused_biases(tmp_path):
    """A Qwen2 checkpoint run with 4-bit decode GEMVs (gemv_q4_bias) gives exactly the logits of the bf16 engine
    (gemv_bias) on the dequantized weights: both add the bias to the same f32 sum before the one rounding."""
    from checkpoints import write_numpy_checkpoint, write_safetensors
    from llama_npu.engine import Engine
    from llama_npu.models.graph import decode_plan
    from llama_npu.weights import Checkpoint
    from tests.test_q4_engine import _dequantized_copy

    src = write_numpy_checkpoint(tmp_path / "m", hidden=128, n_heads=4, n_kv_heads=2, ffn=256, n_layers=2,
                                 vocab=256, max_position=256,
                                 config_overrides={"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2"})
    ck = Checkpoint(src)
    t = {n: np.array(ck.get(n)) for n in ck.refs}
    rng = np.random.default_rng(4)
    for i in range(2):
        for p, n in (("q", 128), ("k", 64), ("v", 64)):
            t[f"model.layers.{i}.self_attn.{p}_proj.bias"] = to_bf16(rng.normal(0, 0.5, n).astype(np.float32))
    write_safetensors(src / "model.safetensors", t)
    _dequantized_copy(src, tmp_path / "deq")
    runs = {}
    for label, path, mode in (("q4", src, "q4"), ("deq", tmp_path / "deq", "bf16")):
        eng = Engine.load(str(path), device="emu", buckets=(64,), cache_dir=tmp_path / "k", progress=False,
                          context=256, weights_mode=mode, warmup=False)
        kinds = _launch_kinds(eng.plans[decode_plan(256)].decls[0])
        assert kinds.count("gemv_q4_bias" if mode == "q4" else "gemv_bias") == 5   # + 2 residual adds
        logits = [eng.prefill([5, 17, 42, 7]).logits]
        for _ in range(3):
            logits.append(np.asarray(eng.decode_step(int(np.argmax(logits[-1])))))
        runs[label] = logits
    for a, b in zip(runs["q4"], runs["deq"]):
        np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32))
