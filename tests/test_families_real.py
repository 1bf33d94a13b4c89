"""The families at real models' layer widths (llama_npu.models.FAMILY_SHAPES: Qwen2.5-1.5B, Qwen3-0.6B / 1.7B,
Mistral-7B, Phi-4-mini): every stitched module passes the NPU2 hardware model, the bias_add objects they link run
through the host aie_api against the reference, and a 2-layer random-weight checkpoint with the real hidden /
heads / head_dim / intermediate widths (a 512-word vocabulary) passes the verify gate on emu."""
from __future__ import annotations

import re

import numpy as np
import pytest

from llama_npu.models import FAMILY_SHAPES, family_model
from tooling import require_module, require_tool

BUCKETS, CONTEXT = (64, 256), 512
LINK = re.compile(r'link_with\s*=\s*"([^"]+)"')


def _stitched(name):
    from multi_launch_builder.stitcher import stitch

    return [(d.name, stitch(d)) for d in family_model(name).modules(BUCKETS, CONTEXT)]


@pytest.mark.parametrize("name", list(FAMILY_SHAPES))
def test_every_module_passes_the_hardware_model(name):
    from kernel_builder.hw import analyze_module

    bad = []
    for mod, text in _stitched(name):
        r = analyze_module(text, mod)
        if not r.ok:
            bad.append(mod)
    assert not bad, f"{name}: over an NPU2 limit: {bad}"


def test_bias_add_objects_run_on_the_host_aie_api():
    from kernel_builder import aie_host
    from kernel_builder import aie_host_runs as runs

    require_tool("g++")
    objs = sorted({o for _, t in _stitched("qwen2.5-1.5b") for o in LINK.findall(t) if o.startswith("bias_add")})
    assert objs == ["bias_add_n1536.o", "bias_add_n256.o"]
    aie_host.build_all([runs.kernel_of(o) for o in objs])
    for o in objs:
        r = runs.run(o, np.random.default_rng(5))
        assert not runs.mismatch(r), f"{o}: {runs.mismatch(r)}"


def _checkpoint(hf_checkpoint, name):
    arch, s = FAMILY_SHAPES[name]
    kw = dict(hidden=s.hidden, n_heads=s.n_heads, n_kv_heads=s.n_kv_heads, head_dim=s.head_dim, ffn=s.ffn,
              n_layers=2, vocab=512, seed=21, max_position=4096)
    if arch == "Qwen2ForCausalLM":
        kw.update(arch="qwen2", rope_theta=1000000.0, tie=True)
    elif arch == "MistralForCausalLM":
        kw.update(arch="mistral", rope_theta=1000000.0, sliding_window=None)
    else:   # Phi-4-mini: partial rotary 0.75, longrope (original 4096 of 131072), tied
        rot = s.rot // 2
        kw.update(arch="phi3", rope_theta=10000.0, tie=True, partial_rotary_factor=s.rot / s.head_dim,
                  max_position=131072, original_max_position_embeddings=4096, pad_token_id=0,
                  rope_scaling={"rope_type": "longrope", "short_factor": [1.0 + 0.02 * i for i in range(rot)],
                                "long_factor": [1.0 + 0.5 * i for i in range(rot)]})
    return hf_checkpoint(**kw)


@pytest.mark.parametrize("name", ["qwen2.5-1.5b", "phi-4-mini", "mistral-7b"])
def test_real_widths_pass_the_verify_gate(hf_checkpoint, tmp_path, monkeypatch, name):
    require_module("torch")
    from llama_npu import embedded
    from verify import cli

    # the compiled-module store keeps one artifact per module name: this model's own store, so its qkv_s64 does
    # not replace another model's while that one runs
    monkeypatch.setattr(embedded, "cache_root", lambda: tmp_path)
    model_dir = _checkpoint(hf_checkpoint, name)
    argv = ["verify", "--model", str(model_dir), "--device", "emu", "--buckets", "64", "--n-tokens", "8",
            "--report-dir", str(tmp_path / "report")]
    assert cli.main(argv) == 0


def test_sliding_window_modules_pass_the_hardware_model():
    """Mistral-7B's widths with v0.1's window of 4096 at an 8192-row context: the sliding modules (prefill chunks
    past the window, the decode layer) read window + rows - 1 keys in whole tiles and fit the chip; Gemma-3-1B's
    local ones likewise (window 512)."""
    import dataclasses

    from kernel_builder.hw import analyze_module
    from llama_npu.models import FAMILIES
    from llama_npu.models.gemma3 import GEMMA3_1B, GLOBAL, LOCAL, Gemma3Model
    from multi_launch_builder.stitcher import stitch

    arch, s = FAMILY_SHAPES["mistral-7b"]
    mistral = FAMILIES[arch](dataclasses.replace(s, n_layers=2), sliding_window=4096)
    gemma = Gemma3Model(dataclasses.replace(GEMMA3_1B, n_layers=2, vocab=512), (LOCAL, GLOBAL), 512, 256)
    decls = [d for m in (mistral, gemma) for d in m.modules((64, 256), 8192) if "slide" in d.name]
    assert {d.name for d in decls} == {"attn_s64_slide4160", "attn_s256_slide4352", "layer_slide4096",
                                       "attn_s64_slide576_local", "attn_s256_slide768_local", "layer_slide512_local"}
    for d in decls:
        rep = analyze_module(stitch(d), d.name)
        assert rep.ok, rep.first_violation()
