"""GEMM epilogue fusion (llama_npu/models/fusion.py): the graph rewrite and the fused modules' numerics. SwiGLU is
fused by default (gemm_swiglu on the interleaved gate/up weight lowers); the bias epilogue is off (it does not
lower yet: docs/kernels.md "Epilogues"). With both on, a tiny Llama's and a tiny Qwen2's prefill modules give the
unfused results on emu (the fused references are the unfused compositions) and on the AIR interpreter."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from kernel_builder.numerics import BF16
from llama_npu.models import fusion
from llama_npu.models.graph import Weight
from llama_npu.models.llama import LlamaModel, ModelShapes
from llama_npu.models.qwen2 import Qwen2Model
from multi_launch_builder.devices.emu import EmuDevice
from multi_launch_builder.devices.interp import InterpEmuDevice
from multi_launch_builder.stitcher import stitch
from test_air_interp import _artifact, _inputs, _run, _shapes_of

TINY = ModelShapes(hidden=64, n_heads=2, n_kv_heads=1, head_dim=32, ffn=128, vocab=256, n_layers=1, rms_eps=1e-5)
BOTH = ("swiglu", "bias_add")


def test_rewrite_fuses_private_linears_only():
    g = LlamaModel(TINY).graph
    f = fusion.fuse_epilogues(g, BOTH)
    kinds = [op.kind for op in f.ops]
    assert "linear_swiglu" in kinds and "swiglu" not in kinds
    fused = next(op for op in f.ops if op.kind == "linear_swiglu")
    assert fused.ins == ("h2", Weight("w_gate_up")) and fused.out == "act"
    assert {op.out for op in g.ops} - {op.out for op in f.ops} == {"gate_up"}
    assert fusion.fuse_epilogues(g) == fusion.fuse_epilogues(g, ("swiglu",)) != g   # the default fuses SwiGLU only
    # a linear output read by anything else (or a layer output) stays unfused
    shared = dataclasses.replace(g, outputs=g.outputs + ("gate_up",))
    assert "linear_swiglu" not in [op.kind for op in fusion.fuse_epilogues(shared, BOTH).ops]
    # the two-weight form (4-bit graphs) is never fused: its W panel would need two loads
    q4 = LlamaModel(TINY, weights="q4").graph
    assert [op.kind for op in q4.ops].count("linear") == 7 and fusion.fuse_epilogues(q4, BOTH) == q4
    q = fusion.fuse_epilogues(Qwen2Model(TINY).graph, BOTH)
    biased = [op for op in q.ops if op.kind == "linear_bias"]
    assert [(op.out, op.into) for op in biased] == [("q", ""), ("k", ""), ("v_new", "v_cache")]
    assert not [op for op in q.ops if op.kind == "bias_add"]


@pytest.mark.parametrize("model", [LlamaModel, Qwen2Model], ids=["llama", "qwen2"])
def test_fused_modules_match_the_unfused(monkeypatch, tmp_path, model):
    """The fused prefill modules (one gemm_swiglu / gemm_bias launch) on emu-interp against the unfused modules on
    emu, tensor by tensor (every output the fused module still has)."""
    monkeypatch.setattr(fusion.fuse_epilogues, "__defaults__", ((),))
    plain = {d.name: d for d in model(TINY).prefill(16).decls}
    assert not any('kind = "gemm_swiglu"' in stitch(d) for d in plain.values())
    monkeypatch.setattr(fusion, "DEFAULT", BOTH)
    monkeypatch.setattr(fusion.fuse_epilogues, "__defaults__", (BOTH,))
    fused = {d.name: d for d in model(TINY).prefill(16).decls}
    assert any("gemm_" in stitch(d) and ('kind = "gemm_swiglu"' in stitch(d) or 'kind = "gemm_bias"' in stitch(d))
               for d in fused.values())
    for name, d in fused.items():
        if "attn" in name:
            continue
        text, ref_text = stitch(d), stitch(plain[name])
        data = _inputs(_shapes_of(text), seed=1)
        by_name = dict(zip([a.name for a in d.args], data))
        ref_data = [by_name[a.name] if a.name in by_name else np.zeros(a.shape, BF16) for a in plain[name].args]
        got = _run(InterpEmuDevice(), _artifact(tmp_path, name, text), data)
        ref = _run(EmuDevice(), _artifact(tmp_path, name + "_ref", ref_text), ref_data)
        want = dict(zip([a.name for a in plain[name].args], ref))
        for a, g in zip(d.args, got):
            r = want[a.name]
            scale = float(np.abs(r).max()) or 1.0
            assert float(np.abs(g - r).max()) <= 4 * scale * 2.0 ** -8, (name, a.name)
