"""Every kernel builder at the reference model shapes: AIR structure checks (tests/air_checks.py), upstream
mlir-opt-22 verification of everything that is not AIR custom syntax, and the llama_npu.kernel attribute."""
from __future__ import annotations

import os
import shutil
import subprocess
import time

import pytest

from kernel_builder.kernels import add, flash_attn, gemm, gemv, rmsnorm, rope, swiglu
from multi_launch_builder.shapes import LLAMA32_1B, LLAMA32_3B, SMOLLM2_135M
from tests import air_checks
from tests.tooling import require_tool

MODELS = {"llama32_1b": LLAMA32_1B, "llama32_3b": LLAMA32_3B, "smollm2_135m": SMOLLM2_135M}


def model_kernels(s, seq: int):
    """(builder call, expected llama_npu.kernel) for every kernel one layer uses at `seq` rows."""
    out = [
        (lambda: rmsnorm.build(seq, s.hidden, s.rms_eps),
         {"kind": "rmsnorm", "rows": seq, "dim": s.hidden, "eps": pytest.approx(s.rms_eps, rel=1e-6)}),
        (lambda: rope.build(seq, s.n_heads, s.head_dim),
         {"kind": "rope", "rows": seq, "heads": s.n_heads, "head_dim": s.head_dim}),
        (lambda: rope.build(seq, s.n_kv_heads, s.head_dim),
         {"kind": "rope", "rows": seq, "heads": s.n_kv_heads, "head_dim": s.head_dim}),
        (lambda: swiglu.build(seq, s.ffn), {"kind": "swiglu", "rows": seq, "dim": s.ffn}),
        (lambda: add.build(seq, s.hidden), {"kind": "add", "rows": seq, "dim": s.hidden, "flat_out": 0}),
        (lambda: add.build(seq, s.hidden, flat_out=True),
         {"kind": "add", "rows": seq, "dim": s.hidden, "flat_out": 1}),
    ]
    projections = [(s.hidden, s.q_dim), (s.hidden, s.kv_dim), (s.q_dim, s.hidden), (s.hidden, s.ffn),
                   (s.ffn, s.hidden)]
    if seq == 1:
        for k, m in projections:
            out.append((lambda m=m, k=k: gemv.build(m, k), {"kind": "gemv", "m": m, "k": k}))
    else:
        for k, n in projections:
            out.append((lambda k=k, n=n: gemm.build(seq, k, n), {"kind": "gemm", "m": seq, "k": k, "n": n}))
        out.append((lambda: flash_attn.build(seq, s.n_heads, s.n_kv_heads, s.head_dim),
                    {"kind": "flash_attn", "seq": seq, "heads": s.n_heads, "kv_heads": s.n_kv_heads,
                     "head_dim": s.head_dim, "causal": 1}))
    return out


CASES = [(f"{name}-s{seq}-{i}", s, seq, i) for name, s in MODELS.items() for seq in (1, 64, 2048)
         for i in range(len(model_kernels(s, seq)))]


@pytest.fixture(scope="module")
def mlir_opt():
    return require_tool("mlir-opt-22")


def _generic_parse(mlir_opt: str, text: str) -> None:
    air_checks.mlir_opt_verify(mlir_opt, air_checks.to_generic(text))


@pytest.mark.parametrize("case,s,seq,i", CASES, ids=[c[0] for c in CASES])
def test_builder_structure(case, s, seq, i):
    build, expected = model_kernels(s, seq)[i]
    text = build()
    rep = air_checks.check_module(text)
    assert rep.errors == [], "\n".join(rep.errors)
    assert rep.kernels == [expected]
    assert len(rep.public) == 1 and rep.public[0][0] == expected["kind"]
    # the herd of every kernel fits the 8x4 array
    for h in rep.herds:
        assert h.types, "herd without operands"


@pytest.mark.parametrize("case,s,seq,i", [c for c in CASES if c[2] in (1, 64)], ids=[c[0] for c in CASES
                                                                                      if c[2] in (1, 64)])
def test_builder_mlir_opt(case, s, seq, i, mlir_opt):
    build, _ = model_kernels(s, seq)[i]
    text = build()
    _generic_parse(mlir_opt, text)
    air_checks.mlir_opt_verify(mlir_opt, air_checks.signature_module(text), unregistered=False)
    for _, mod in air_checks.herd_modules(text):
        air_checks.mlir_opt_verify(mlir_opt, mod)


@pytest.mark.parametrize("name", list(MODELS))
def test_builder_mlir_opt_seq2048_whole_module(name, mlir_opt):
    # one mlir-opt call per kernel (seq 2048 differs from seq 64 only in constants/plans)
    for build, _ in model_kernels(MODELS[name], 2048):
        _generic_parse(mlir_opt, build())


def test_signature_and_arg_types():
    s = LLAMA32_1B
    rep = air_checks.check_module(gemv.build(s.kv_dim, s.hidden))
    assert rep.public[0][2] == ["memref<512x2048xbf16>", "memref<1x2048xbf16>", "memref<1x512xbf16>"]
    rep = air_checks.check_module(add.build(64, 2048, flat_out=True))
    assert rep.public[0][2][-1] == "memref<131072xbf16>"
    rep = air_checks.check_module(flash_attn.build(64, 32, 8, 64))
    assert rep.public[0][2] == ["memref<64x2048xbf16>", "memref<64x512xbf16>", "memref<64x512xbf16>",
                                "memref<64x2048xbf16>"]
    rep = air_checks.check_module(rope.build(1, 8, 64))
    assert rep.public[0][2] == ["memref<1x512xbf16>", "memref<1x64xbf16>", "memref<1x512xbf16>"]


def test_bare_herds_and_launches():
    rms = air_checks.check_module(rmsnorm.build(64, 2048, 1e-5))
    assert [op.kind for op in rms.air_ops] == ["air.herd"] and rms.air_ops[0].func_level
    g = air_checks.check_module(gemm.build(64, 2048, 512))
    assert [op.kind for op in g.air_ops] == ["air.launch", "air.segment", "air.herd", "air.herd"]


def test_gemv_k_variants_have_distinct_symbols():
    a = air_checks.check_module(gemv.build(2048, 2048))
    b = air_checks.check_module(gemv.build(2048, 8192))
    assert set(a.decls).isdisjoint(b.decls)
    for rep in (a, b):
        (decl,) = [d for ds in rep.decls.values() for d in ds]
        assert rep.herds[0].attrs["link_with"] == decl.attrs["link_with"]


def test_causal_flag_changes_module():
    c = flash_attn.build(64, 32, 8, 64, causal=True)
    nc = flash_attn.build(64, 32, 8, 64, causal=False)
    assert air_checks.check_module(nc).kernels[0]["causal"] == 0
    assert air_checks.check_module(c).kernels[0]["causal"] == 1
    assert air_checks.check_module(nc).errors == []


def test_generation_is_fast():
    s = LLAMA32_1B
    t0 = time.perf_counter()
    for seq in (1, 2048):
        for build, _ in model_kernels(s, seq):
            build()
    assert time.perf_counter() - t0 < 1.0


@pytest.mark.parametrize("bad", [
    lambda: rmsnorm.build(0, 2048, 1e-5),
    lambda: rmsnorm.build(4, 2048, 0.0),
    lambda: gemm.build(64, 2048, 0),
    lambda: gemv.build(2048, 100),
    lambda: rope.build(4, 8, 63),
    lambda: flash_attn.build(64, 30, 8, 64),
    lambda: flash_attn.build(64, 32, 8, 63),
    lambda: swiglu.build(1, 8190),
    lambda: add.build(-1, 8),
])
def test_bad_shapes_raise_value_error(bad):
    with pytest.raises(ValueError):
        bad()


# --- the checker itself must catch broken modules -------------------------------------------------------
def _mutate(text: str, old: str, new: str) -> str:
    assert old in text, old
    return text.replace(old, new, 1)


def test_checker_catches_errors():
    good = gemv.build(512, 2048)
    assert air_checks.check_module(good).errors == []
    broken = {
        "args count": _mutate(good, "%ha_2=%sa_2) :", ") :"),
        "bound type": _mutate(good, "args(%sa=%la, %sa_1=%la_1", "args(%sa=%la_1, %sa_1=%la"),
        "isolation": _mutate(good, "%x_l1[] [] [], %ha_1[", "%x_l1[] [] [], %la_1["),
        "memory space": _mutate(good, "memref.alloc() : memref<2048xbf16, 2 : i32>",
                                "memref.alloc() : memref<2048xbf16, 1 : i32>"),
        "link_with": _mutate(good, 'attributes {link_with = "mv_k2048', 'attributes {link_with = "other'),
        "kernel attr": _mutate(good, "llama_npu.kernel", "other.kernel"),
        "undefined": _mutate(good, "arith.addi %t, %i", "arith.addi %nope, %i"),
    }
    for what, text in broken.items():
        assert air_checks.check_module(text).errors, f"checker missed: {what}"
    rep = air_checks.check_module(good, expect_kernels=[{"kind": "gemv", "m": 512, "k": 4096}])
    assert rep.errors


def test_mlir_opt_catches_type_errors(mlir_opt):
    good = gemm.build(64, 576, 192)
    bad = _mutate(good, "outs(%acc_l1 : memref<8x48xf32, 2 : i32>)", "outs(%acc_l1 : memref<8x40xf32, 2 : i32>)")
    with pytest.raises(AssertionError):
        _generic_parse(mlir_opt, bad)


def test_air_opt_if_available():
    air_opt = os.environ.get("AIR_OPT")
    if not air_opt:
        pytest.skip("AIR_OPT not set (no air-opt on this machine)")
    assert shutil.which(air_opt) or os.path.exists(air_opt)
    s = LLAMA32_1B
    for seq in (1, 64):
        for build, _ in model_kernels(s, seq):
            res = subprocess.run([air_opt, "-"], input=build(), capture_output=True, text=True, timeout=120)
            assert res.returncode == 0, res.stderr
