"""Whole stitched modules through a real AIR front end (air-opt), when AIR_OPT points to one.

air-opt parses and verifies AIR text exactly as the real toolchain's front end does; it is not installable
from the package registries, so this runs only where a developer built one (skipped otherwise).
"""
from __future__ import annotations

import os
import subprocess

import pytest

from multi_launch_builder.stitcher import stitch
from llama_npu.models.llama import LLAMA32_1B, LLAMA32_3B, SMOLLM2_135M, LlamaModel

AIR_OPT = os.environ.get("AIR_OPT")
pytestmark = pytest.mark.skipif(not AIR_OPT, reason="AIR_OPT not set (no air-opt on this machine)")

CASES = [(shapes, decl) for shapes in (SMOLLM2_135M, LLAMA32_1B, LLAMA32_3B) for decl in LlamaModel(shapes).modules([64])]


@pytest.mark.parametrize("shapes,decl", CASES, ids=[f"{s.hidden}-{d.name}" for s, d in CASES])
def test_stitched_module_verifies_with_air_opt(shapes, decl, tmp_path):
    path = tmp_path / f"{decl.name}.mlir"
    path.write_text(stitch(decl))
    proc = subprocess.run([AIR_OPT, str(path), "-o", os.devnull], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_air_opt_rejects_a_broken_module(tmp_path):
    text = stitch(LlamaModel(SMOLLM2_135M).modules([64])[0])
    path = tmp_path / "broken.mlir"
    path.write_text(text.replace("memref<64x576xbf16>", "memref<64x577xbf16>", 1))
    proc = subprocess.run([AIR_OPT, str(path), "-o", os.devnull], capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
