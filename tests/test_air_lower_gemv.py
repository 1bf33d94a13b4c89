"""The GEMV through the real lowering (mlir-air aircc's npu2 passes + the mlir-aie aiecc passes up to the NPU
instructions), when LLAMA_NPU_AIR_LOWER points to a real-lowering driver (docs/verification.md,
"Real lowering": `air-lower.sh [--whole] [-q] MODULE.mlir OUTDIR`, last line `OK ...` or
`FAIL <stage>/<pass>: ...`); skipped otherwise (no such toolchain in CI). Each case also asks the hardware
model, whose verdict must agree, and reads the lowering's output: one circuit flow from a shim MM2S channel
into every tile and one back (16 + 16 at the [8, 2] herds), and the L1 buffers each tile gets equal the plan's (x once, the weight block twice, acc, y).
The stitched Llama-3.2-1B `layer_kv256` and `lm_head` lower too (about 10-20 s each)."""
from __future__ import annotations

import os
import re
from collections import Counter

import pytest

from kernel_builder.gemv import plan as gemv_plan
from kernel_builder.hw import analyze_module
from multi_launch_builder.compile.lowering import lower_with_tool
from kernel_builder.registry import kernel_text

LOWER = os.environ.get("LLAMA_NPU_AIR_LOWER", "")

pytestmark = pytest.mark.skipif(not LOWER, reason="LLAMA_NPU_AIR_LOWER not set (no mlir-air/mlir-aie lowering here)")

CASES = [
    (2048, 2048),    # Llama-3.2-1B q / o
    (512, 2048),     # k / v
    (8192, 2048),    # gate / up
    (2048, 8192),    # down: one 8192-element row per step
    (16384, 2048),   # LM-head partition: 1024 rows per tile, 256 weight blocks
    (576, 576),      # SmolLM2 q / o: 9-row blocks
    (20, 64),        # a [5, 2] herd
]


@pytest.mark.parametrize("m,k", CASES, ids=lambda c: str(c))
def test_gemv_lowers_with_one_stream_per_tile(tmp_path, m, k):
    text = kernel_text("gemv", m, k)
    p = gemv_plan.plan_gemv(m, k)
    src = tmp_path / f"gemv_{m}_{k}.mlir"
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
    assert len(inbound) == len({d for _, d in inbound}) == p.tiles      # one stream into each tile
    assert len(outbound) == len({s for s, _ in outbound}) == p.tiles    # one y stream out of each tile

    placed = (out / "input_with_addresses.mlir").read_text()
    # (the file may hold the device more than once: one entry per buffer symbol)
    bufs = set(re.findall(r"aie\.buffer\(%(tile_\d+_\d+)\) \{[^}]*sym_name = \"(\w+)\"\} : memref<([^>]*)>", placed))
    bufs = [(t, ty) for t, _, ty in bufs]
    per_tile = Counter(t for t, _ in bufs)
    assert len(per_tile) == p.tiles
    tile = sorted(per_tile)[0]
    mine = sorted(ty for t, ty in bufs if t == tile)
    copies = 2 if p.pingpong else 1
    want = sorted([f"{p.tile_m}x{p.k_chunk}xbf16, 2 : i32"] * copies + [f"{k}xbf16, 2 : i32",
                  f"{p.tile_m}xf32, 2 : i32", f"{p.rows_per_tile}xbf16, 2 : i32"])
    assert mine == want, (mine, want)


@pytest.mark.parametrize("name", ["layer_kv256", "lm_head"])
def test_stitched_decode_modules_lower(tmp_path, name):
    """The Llama-3.2-1B fused decode layer and LM head with the 16-stream GEMVs, with the preset their header
    records (the model layer's): the lowering writes the NPU instructions, and the model agrees."""
    from llama_npu.models.llama import LLAMA32_1B, LlamaModel
    from multi_launch_builder.stitcher import stitch
    m = LlamaModel(LLAMA32_1B)
    (decl,) = [d for d in m.decode(256).decls + m.head().decls if d.name == name]
    text = stitch(decl)
    src = tmp_path / f"{name}.mlir"
    src.write_text(text)
    res = lower_with_tool(LOWER, src, tmp_path / "out", timeout=1800)
    assert res.ok, f"{res.stage}: {res.message}"
    rep = analyze_module(text, name)
    assert rep.ok, rep.first_violation()
    gemv_launches = [l for l in rep.launches if "gemv" in l.name]
    assert gemv_launches and all(l.usage.shim_mm2s == 16 for l in gemv_launches)
