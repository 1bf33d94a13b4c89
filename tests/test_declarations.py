"""The six multi-launch module declarations, stitched from the real kernel builders at real model shapes:
structure (tests/air_checks.py), non-AIR parts verified by mlir-opt-22, and the wiring read back from the
stitched text (kernel_builder.launch_program) equal to the declaration."""
from __future__ import annotations

import functools
import re
import time

import pytest

import air_checks
from kernel_builder.launch_program import read_launch_program
from kernel_builder.planner import plan_lm_head
from kernel_builder.stitching import stitch
from multi_launch_builder import clear_kernel_cache, kernel_text
from multi_launch_builder.decl import Role
from multi_launch_builder.registry import all_modules, decode_modules, prefill_modules
from multi_launch_builder.shapes import LLAMA32_1B, SMOLLM2_135M
from tooling import require_tool

MODELS = {"llama32_1b": LLAMA32_1B, "smollm2_135m": SMOLLM2_135M}
CASES = [(m, seq, i) for m in MODELS for seq in (64,) for i in range(6)] + [("llama32_1b", 2048, i) for i in range(3)]


@functools.lru_cache(maxsize=None)
def _decl(model: str, seq: int, i: int):
    return (prefill_modules(MODELS[model], seq) + decode_modules(MODELS[model]))[i]


@functools.lru_cache(maxsize=None)
def _stitched(model: str, seq: int, i: int) -> str:
    return stitch(_decl(model, seq, i))


def _id(case):
    return f"{case[0]}-s{case[1]}-{_decl(*case).name}"


@pytest.mark.parametrize("case", CASES, ids=[_id(c) for c in CASES])
def test_wiring_read_back_equals_declaration(case):
    decl, text = _decl(*case), _stitched(*case)
    prog = read_launch_program(text)
    assert prog.name == decl.name
    assert prog.arg_shapes == tuple(a.shape for a in decl.args)
    assert len(prog.launches) == len(decl.launches)
    for spec, launch in zip(prog.launches, decl.launches):
        assert spec.operands == tuple(decl.index(n) for n in launch.wiring), launch.prefix
        # kind and params survive stitching unchanged
        (alone,) = read_launch_program(launch.build()).launches
        assert (spec.kind, spec.params) == (alone.kind, alone.params), launch.prefix


@pytest.mark.parametrize("case", CASES, ids=[_id(c) for c in CASES])
def test_stitched_structure(case):
    decl, text = _decl(*case), _stitched(*case)
    rep = air_checks.check_module(text)
    assert rep.errors == []
    kinds = [read_launch_program(l.build()).launches[0].kind for l in decl.launches]
    assert [k["kind"] for k in rep.kernels] == kinds
    assert [op.kind for op in rep.air_ops if op.func_level] == ["air.launch"] * len(decl.launches)
    assert rep.public[0][0] == decl.name and rep.public[0][2] == [a.memref_type for a in decl.args]
    # every segment/herd symbol and every private declaration exists exactly once
    syms = re.findall(r"air\.(?:segment|herd) @([\w$.]+)", text)
    assert len(syms) == len(set(syms))
    decls = re.findall(r"func\.func private @([\w$.]+)", text)
    assert len(decls) == len(set(decls))


@pytest.mark.parametrize("case", CASES, ids=[_id(c) for c in CASES])
def test_non_air_parts_verify_with_mlir_opt(case):
    mlir_opt = require_tool("mlir-opt-22")
    air_checks.mlir_opt_verify(mlir_opt, air_checks.to_generic(_stitched(*case)))


def test_roles_and_names():
    for shapes in MODELS.values():
        rgr, fa, off = prefill_modules(shapes, 64)
        assert (rgr.name, fa.name, off.name) == ("rms_gemms_rope_s64", "flash_attn_s64", "o_ffn_s64")
        assert rgr.names(Role.OUTPUT) == ("v", "q_roped", "k_roped")
        assert off.names(Role.OUTPUT) == ("x_out",) and off.arg("x_out").shape == (64 * shapes.hidden,)
        dec = decode_modules(shapes)
        assert [d.name for d in dec] == ["rms_gemv_rope", "o_gemv_ffn", "lm_head_gemv"]
        lm = dec[2]
        plan = plan_lm_head(shapes.vocab, shapes.hidden)
        assert plan.n_parts * plan.part_rows >= shapes.vocab
        assert lm.names(Role.STATIC) == tuple(f"w_{p}" for p in range(plan.n_parts))
        assert lm.names(Role.OUTPUT) == tuple(f"logits_{p}" for p in range(plan.n_parts))
        assert lm.arg("w_0").shape == (plan.part_rows, shapes.hidden)
    names = [d.name for d in all_modules(SMOLLM2_135M, (256, 64, 64))]
    assert names == ["rms_gemms_rope_s64", "flash_attn_s64", "o_ffn_s64", "rms_gemms_rope_s256",
                     "flash_attn_s256", "o_ffn_s256", "rms_gemv_rope", "o_gemv_ffn", "lm_head_gemv"]


def test_identical_kernels_are_generated_once():
    clear_kernel_cache()
    decl = prefill_modules(SMOLLM2_135M, 64)[2]  # o_ffn: gate and up GEMMs share one shape
    for launch in decl.launches:
        launch.build()
    assert kernel_text.cache_info().misses == len(decl.launches) - 1
    lm = decode_modules(SMOLLM2_135M)[2]
    before = kernel_text.cache_info().misses
    for launch in lm.launches:
        launch.build()
    assert kernel_text.cache_info().misses == before + 1  # all partitions share one GEMV


def test_generate_and_stitch_timing():
    """Not an assertion on speed: prints the time `make bench` reports."""
    from kernel_builder.stitching import bench_stitch

    t0 = time.perf_counter()
    secs = bench_stitch(LLAMA32_1B, buckets=(2048,))
    print(f"\ngenerate + stitch all six modules for Llama-3.2-1B (prefill 2048): {secs:.3f} s "
          f"(wall {time.perf_counter() - t0:.3f} s)")
    assert secs > 0
