"""The block-float GEMV (`gemv_bfp`, `gemv_bfp_bias`) through the real lowering (mlir-air aircc's npu2 passes + the
mlir-aie aiecc passes up to the NPU instructions), when LLAMA_NPU_AIR_LOWER points to a real-lowering driver
(docs/verification.md, "Real lowering"); skipped otherwise. Each case also asks the hardware model, whose verdict
must agree, and reads the lowering's output: one circuit flow from a shim MM2S channel into every tile and one
back, and the L1 buffers each tile gets equal the plan's (the i8 weight block twice, x (+ bias rows), acc, y)."""
from __future__ import annotations

import os
import re
from collections import Counter

import pytest

from kernel_builder.gemv_bfp.plan import plan_gemv_bfp
from kernel_builder.hw import analyze_module
from kernel_builder.registry import kernel_text
from multi_launch_builder.compile.lowering import lower_with_tool

LOWER = os.environ.get("LLAMA_NPU_AIR_LOWER", "")

pytestmark = pytest.mark.skipif(not LOWER, reason="LLAMA_NPU_AIR_LOWER not set (no mlir-air/mlir-aie lowering here)")

CASES = [                        # Llama-3.2-1B decode
    ("gemv_bfp", 2048, 2048),        # q
    ("gemv_bfp", 512, 2048),         # k / v
    ("gemv_bfp", 8192, 2048),        # gate / up
    ("gemv_bfp_bias", 2048, 8192),   # down + residual: 4 K chunks per block row
    ("gemv_bfp_bias", 2048, 2048),   # o + residual
    ("gemv_bfp", 16384, 2048),       # an LM-head partition of the 128256 vocabulary
    ("gemv_bfp", 576, 576),          # SmolLM2-135M q / o: a [6, 2] herd of 48-row tiles
    ("gemv_bfp_bias", 576, 1536),    # SmolLM2-135M down + residual
    ("gemv_bfp", 6144, 576),         # SmolLM2-135M LM-head partition (two block rows per step)
    ("gemv_bfp", 16384, 3072),       # Llama-3.2-3B interleaved gate/up: 2 K chunks per block row
    ("gemv_bfp_bias", 3072, 8192),   # Llama-3.2-3B down + residual
]


@pytest.mark.parametrize("kind,m,k", CASES, ids=lambda c: str(c))
def test_gemv_bfp_lowers_with_one_stream_per_tile(tmp_path, kind, m, k):
    text = kernel_text(kind, m, k)
    bias = kind.endswith("bias")
    p = plan_gemv_bfp(m, k, bias)
    src = tmp_path / f"{kind}_{m}_{k}.mlir"
    src.write_text(text)
    out = tmp_path / "out"
    res = lower_with_tool(LOWER, src, out, timeout=1800)
    assert res.ok, f"{res.stage}: {res.message}"
    rep = analyze_module(text)
    assert rep.ok, rep.first_violation()
    assert (rep.usage.shim_mm2s, rep.usage.shim_s2mm) == (p.tiles, p.tiles)

    aie = next(out.glob("aie.*.mlir")).read_text()
    flows = re.findall(r"aie\.flow\(%(\w+), DMA : \d+, %(\w+), DMA : \d+\)", aie)
    inbound = [(s, d) for s, d in flows if s.startswith("shim") and not d.startswith("shim")]
    outbound = [(s, d) for s, d in flows if d.startswith("shim") and not s.startswith("shim")]
    assert len(inbound) == len({d for _, d in inbound}) == p.tiles
    assert len(outbound) == len({s for s, _ in outbound}) == p.tiles

    placed = (out / "input_with_addresses.mlir").read_text()
    bufs = set(re.findall(r"aie\.buffer\(%(tile_\d+_\d+)\) \{[^}]*sym_name = \"(\w+)\"\} : memref<([^>]*)>", placed))
    per_tile = Counter(t for t, _, _ in bufs)
    assert len(per_tile) == p.tiles
    tile = sorted(per_tile)[0]
    mine = sorted(ty for t, _, ty in bufs if t == tile)
    step_bytes = p.tile_m * p.k_chunk * 9 // 8
    want = sorted([f"{step_bytes}xi8, 2 : i32"] * (2 if p.pingpong else 1)
                  + [f"{k + p.rows_per_tile * bias}xbf16, 2 : i32", f"{p.tile_m}xf32, 2 : i32",
                     f"{p.rows_per_tile}xbf16, 2 : i32"])
    assert mine == want, (mine, want)
