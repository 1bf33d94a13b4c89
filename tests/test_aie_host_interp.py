"""emu-interp with LLAMA_NPU_EXTERNALS=aie-host: every external call of every stitched module of a tiny Llama-like
model runs the kernel's AIE2P vector path (host aie_api) inside the interpreted AIR program (herds, L1 buffers,
DMAs), and the module still matches the reference emulation. Tolerance: 4 bf16 ulps of each buffer's scale (the
GEMM's block-float products add ~1 % relative error to single elements: docs/aie-api-host.md); with the numpy
models the interpreter is held to 2 (tests/test_air_interp.py)."""
from __future__ import annotations

import math

import numpy as np
import pytest

from kernel_builder.rmsnorm.external import rmsnorm_kernel
from kernel_builder.aie_host_models import model_for
from multi_launch_builder.devices.emu import EmuDevice
from multi_launch_builder.devices.interp import InterpEmuDevice
from llama_npu.models.llama import LlamaModel
from test_air_interp import MODULES, SEQ, TINY, _artifact, _inputs, _run, _shapes_of
from tooling import require_tool

ULPS = 4


@pytest.fixture(scope="module")
def stitched():
    from multi_launch_builder.stitcher import stitch
    require_tool("g++")
    m = LlamaModel(TINY)
    return {d.name: stitch(d) for d in m.modules([SEQ]) + m.modules([SEQ], decode_attention="host")}


@pytest.fixture
def vector_paths(monkeypatch):
    monkeypatch.setenv("LLAMA_NPU_EXTERNALS", "aie-host")


@pytest.mark.parametrize("name", MODULES)
def test_stitched_module_runs_the_vector_paths(stitched, tmp_path, vector_paths, name):
    text = stitched[name]
    art = _artifact(tmp_path, name, text)
    data = _inputs(_shapes_of(text), seed=MODULES.index(name))
    ref = _run(EmuDevice(), art, data)
    got = _run(InterpEmuDevice(), art, data)
    for i, (g, r) in enumerate(zip(got, ref)):
        scale = float(np.abs(r).max())
        tol = 0.0 if scale == 0 else ULPS * 2.0 ** (math.floor(math.log2(scale)) - 7)
        assert np.isfinite(g).all() and float(np.abs(g - r).max()) <= tol, f"{name}: argument {i}"


def test_external_model_switch(monkeypatch):
    sym = rmsnorm_kernel(64, 1).symbol
    monkeypatch.setenv("LLAMA_NPU_EXTERNALS", "aie-host")
    assert model_for(sym).__module__ == "kernel_builder.aie_host_models"
    monkeypatch.setenv("LLAMA_NPU_EXTERNALS", "numpy")
    assert model_for(sym).__module__ == "kernel_builder.rmsnorm.external"  # the kernel's own numpy model
    monkeypatch.setenv("LLAMA_NPU_EXTERNALS", "peano")
    with pytest.raises(ValueError, match="expected 'numpy'"):
        model_for(sym)


def test_runtime_on_the_vector_paths(tmp_path, vector_paths, monkeypatch):
    """Prefill, KV cache and decode of a tiny model on emu-interp with every external call on its AIE2P vector path:
    the reference emulator's tokens, logits within 4 bf16 ulps of their scale."""
    from checkpoints import write_numpy_checkpoint
    from kernel_builder import aie_host
    from test_interp_engine import _run as run_engine

    model = write_numpy_checkpoint(tmp_path / "model", hidden=64, n_heads=2, n_kv_heads=1, ffn=128, vocab=256,
                                   max_position=64, seed=3)
    ref_tokens, ref_logits = run_engine(model, "emu", tmp_path / "k")
    called = set()
    real_call = aie_host.AieHostLibrary.call

    def call(self, symbol, *args):
        called.add(symbol.split("_bf16")[0])
        return real_call(self, symbol, *args)

    monkeypatch.setattr(aie_host.AieHostLibrary, "call", call)
    tokens, logits = run_engine(model, "emu-interp", tmp_path / "k")
    assert tokens == ref_tokens
    assert {"gemm_mac", "mv", "rmsnorm", "rope", "swiglu", "add", "attnp_item", "attnd_step", "attnd_merge"} <= called
    for a, b in zip(ref_logits, logits):
        np.testing.assert_allclose(b, a, atol=ULPS * 2.0**-8 * float(np.abs(a).max()), rtol=0)
