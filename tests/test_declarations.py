"""The module declarations derived from the layer graph (llama_npu.models), stitched from the real kernel
builders at real model shapes: structure (tests/air_checks.py), non-AIR parts verified by mlir-opt-22, the
wiring read back from the stitched text (multi_launch_builder.emulator.launch_program) equal to the declaration, and the
roles the derivation assigns."""
from __future__ import annotations

import functools
import re

import pytest

import air_checks
import air_generic
from multi_launch_builder.emulator.launch_program import read_launch_program
from kernel_builder.gemv.plan import plan_lm_head
from multi_launch_builder.stitcher import stitch
from multi_launch_builder.decl import Role
from kernel_builder.registry import clear_kernel_cache, kernel_text
from llama_npu.models.llama import LLAMA32_1B, SMOLLM2_135M, LlamaModel, QKNormLlama
from tooling import require_tool

MODELS = {"llama32_1b": LLAMA32_1B, "smollm2_135m": SMOLLM2_135M}
CASES = [(m, seq, i) for m in MODELS for seq in (64,) for i in range(6)] + [("llama32_1b", 2048, i) for i in range(3)]


def _modules(shapes, seq):
    m = LlamaModel(shapes)
    return m.prefill(seq).decls + m.decode().decls + m.head().decls


@functools.lru_cache(maxsize=None)
def _decl(model: str, seq: int, i: int):
    return _modules(MODELS[model], seq)[i]


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
    air_generic.mlir_opt_verify(mlir_opt, air_generic.to_generic(_stitched(*case)))


def test_roles_and_names():
    for shapes in MODELS.values():
        m = LlamaModel(shapes)
        qkv, attn, ffn = m.prefill(64).decls
        assert (qkv.name, attn.name, ffn.name) == ("qkv_s64", "attn_s64", "ffn_s64")
        # q leaves for the attention module; K/V go into the cache (state windows at the position)
        assert qkv.names(Role.OUTPUT) == ("q_roped",)
        assert qkv.names(Role.STATE) == ("v_new", "lut", "k_new") and qkv.scalars == ("pos",)
        assert {a.state_name for a in qkv.args if a.role is Role.STATE} == {"k_cache", "v_cache", "rope"}
        assert attn.names(Role.INPUT) == ("q_roped",) and attn.names(Role.OUTPUT) == ("attn",)
        assert ffn.names(Role.INPUT) == ("attn", "x") and ffn.names(Role.OUTPUT) == ("x_out",)
        assert {d.family for d in (qkv, attn, ffn)} == {"layer"}
        # one row: GEMVs, more rows: GEMMs, both on the HF [out, in] weights: the same static argument
        # (name, shape, dtype) in both phases, so a layer holds one device copy of each weight
        dec = m.decode()        # --decode-attention host
        assert [d.name for d in dec.decls] == ["qkv_dec", "ffn_dec"] and dec.steps[1].host_op.kind == "attention"
        (fused,) = m.decode(512).decls   # the whole layer, attention on the NPU over the cache window [0, 512)
        assert fused.name == "layer_kv512" and fused.scalars == ("pos",)
        assert fused.names(Role.STATIC) == qkv.names(Role.STATIC) + ffn.names(Role.STATIC)
        assert all(fused.arg(n) == (qkv.arg(n) if n in qkv.names(Role.STATIC) else ffn.arg(n))
                   for n in fused.names(Role.STATIC))
        assert fused.arg("k_ctx").shape == (512, shapes.kv_dim) and fused.names(Role.OUTPUT) == ("x_out",)
        assert dec.decls[0].arg("wq").shape == (shapes.q_dim, shapes.hidden)
        for pre, post in ((qkv, dec.decls[0]), (ffn, dec.decls[1])):
            assert pre.names(Role.STATIC) == post.names(Role.STATIC)
            for name in pre.names(Role.STATIC):
                assert pre.arg(name) == post.arg(name) and not name.endswith("_t")
        (lm,) = m.head().decls
        plan = plan_lm_head(shapes.vocab, shapes.hidden)
        assert plan.n_parts * plan.part_rows >= shapes.vocab
        # the partitions are windows of the one VOCAB state at constant rows (the token module's embedding rows)
        assert lm.names(Role.STATIC) == ("final_norm",)
        assert lm.names(Role.STATE) == tuple(f"lm_{p}" for p in range(plan.n_parts))
        assert [(lm.arg(f"lm_{p}").state, lm.arg(f"lm_{p}").at) for p in range(plan.n_parts)] == \
            [("vocab", p * plan.part_rows) for p in range(plan.n_parts)]
        assert lm.names(Role.OUTPUT) == tuple(f"logits_{p}" for p in range(plan.n_parts))
        assert lm.arg("lm_0").shape == (plan.part_rows, shapes.hidden)
    names = [d.name for d in LlamaModel(SMOLLM2_135M).modules((256, 64, 64))]
    # a 64-row chunk may run over the 256 window (the second chunk); the fused decode layer per window
    assert names == ["qkv_s64", "attn_s64", "ffn_s64", "attn_s64_kv256", "qkv_s256", "attn_s256", "ffn_s256",
                     "layer_kv256", "lm_head"]
    host = [d.name for d in LlamaModel(SMOLLM2_135M).modules((256, 64), decode_attention="host")]
    assert host[-3:] == ["qkv_dec", "ffn_dec", "lm_head"]


def test_qk_norm_variant_adds_two_launches_and_two_weights():
    base, qk = LlamaModel(SMOLLM2_135M).prefill(64).decls[0], QKNormLlama(SMOLLM2_135M).prefill(64).decls[0]
    assert len(qk.launches) == len(base.launches) + 2
    assert set(qk.names(Role.STATIC)) - set(base.names(Role.STATIC)) == {"q_norm", "k_norm"}
    assert qk.arg("q_norm").shape == (SMOLLM2_135M.head_dim,)


def test_identical_kernels_are_generated_once():
    decl = LlamaModel(SMOLLM2_135M).prefill(64).decls[2]  # ffn: the two adds share a shape (gate/up: one launch)
    clear_kernel_cache()  # (declaring a phase already generated its kernels: the presets read them)
    for launch in decl.launches:
        launch.build()
    assert kernel_text.cache_info().misses == len(decl.launches) - 1
    (lm,) = LlamaModel(SMOLLM2_135M).head().decls
    clear_kernel_cache()
    before = kernel_text.cache_info().misses
    for launch in lm.launches:
        launch.build()
    assert kernel_text.cache_info().misses == before + 2  # the final norm + one GEMV shared by every partition
