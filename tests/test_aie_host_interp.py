"""emu-interp with LLAMA_NPU_EXTERNALS=aie-host: every external call of every stitched module of a tiny Llama-like
model runs the kernel's AIE2P vector path (host aie_api) inside the interpreted AIR program (herds, L1 buffers,
DMAs), and the module still matches the reference emulation. Tolerance: 4 bf16 ulps of each buffer's scale (the
GEMM's block-float products add ~1 % relative error to single elements: docs/aie-api-host.md); with the numpy
models the interpreter is held to 2 (tests/test_air_interp.py)."""
from __future__ import annotations

import math

import numpy as np
import pytest

from kernel_builder import externals
from kernel_builder.devices.emu import EmuDevice
from kernel_builder.devices.interp import InterpEmuDevice
from llama_npu.models.llama import LlamaModel
from test_air_interp import MODULES, SEQ, TINY, _artifact, _inputs, _run, _shapes_of
from tooling import require_tool

ULPS = 4


@pytest.fixture(scope="module")
def stitched():
    from kernel_builder.stitching import stitch
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
    sym = externals.rmsnorm_kernel(64, 1).symbol
    monkeypatch.setenv("LLAMA_NPU_EXTERNALS", "aie-host")
    assert externals.external_model(sym).__module__ == "kernel_builder.aie_host_models"
    monkeypatch.setenv("LLAMA_NPU_EXTERNALS", "numpy")
    assert externals.external_model(sym).__module__ == "kernel_builder.external_models"
    monkeypatch.setenv("LLAMA_NPU_EXTERNALS", "peano")
    with pytest.raises(ValueError, match="expected 'numpy'"):
        externals.external_model(sym)
