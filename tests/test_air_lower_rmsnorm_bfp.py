"""RMSNorm with its output in block float (`rmsnorm(..., out="bfp16")`) through the real lowering (mlir-air aircc's
npu2 passes + the mlir-aie aiecc passes up to the NPU instructions), when LLAMA_NPU_AIR_LOWER points to a
real-lowering driver (docs/verification.md, "Real lowering"); skipped otherwise. Each case is lowered with the
preset the hardware model derives (its stack, as the bf16 rmsnorm's), the hardware model must accept it too, and the
lowering's output is read: one shim MM2S flow into every tile (x; the weight comes from the memory tile) and one
S2MM flow out of it (y), and the L1 buffers each tile gets equal the plan's (x and w in one copy each with a
`single` plan: the 8 rows of 2048 columns, 32 KiB, fit only so; x in one copy with an `xwhole` plan: the 8 rows of
3072 columns, normalised in chunks)."""
from __future__ import annotations

import os
import re
from collections import Counter

import pytest

from kernel_builder.hw import analyze_module
from kernel_builder.hw.tune import preset_for_kernels
from kernel_builder.registry import kernel_text
from kernel_builder.rmsnorm.bfp_plan import plan_rmsnorm_bfp
from multi_launch_builder.compile.lowering import lower_with_tool

LOWER = os.environ.get("LLAMA_NPU_AIR_LOWER", "")

pytestmark = pytest.mark.skipif(not LOWER, reason="LLAMA_NPU_AIR_LOWER not set (no mlir-air/mlir-aie lowering here)")

TYPES = {"x": ("bf16", 2), "w": ("bf16", 2), "st": ("f32", 4), "y": ("i8", 1)}
CASES = [                 # (rows, dim, offset): the prefill buckets of SmolLM2-135M, Llama-3.2-1B, 3B, 3.1-8B widths
    (2048, 576, 0), (2048, 2048, 0), (2048, 3072, 0), (2048, 4096, 0),
    (64, 2048, 0), (256, 2048, 0), (1024, 2048, 0), (64, 576, 0), (16, 64, 0),
    (2048, 2048, 1),      # Gemma's (1 + w)
    (128, 3072, 0),       # two blocks per tile, 8 whole rows normalised in four chunks
    (2048, 5120, 0),      # two passes (x read twice: 8 rows of 5120 columns do not fit L1)
]


@pytest.mark.parametrize("rows,dim,offset", CASES, ids=lambda c: str(c))
def test_rmsnorm_bfp_lowers(tmp_path, rows, dim, offset):
    text = kernel_text("rmsnorm", rows, dim, 1e-5, offset=offset, out="bfp16")
    p = plan_rmsnorm_bfp(rows, dim, offset)
    preset = preset_for_kernels([text])
    rep = analyze_module(text, preset=preset)
    assert rep.ok, rep.first_violation()
    src = tmp_path / f"rmsnorm_bfp_{rows}_{dim}.mlir"
    src.write_text(text)
    out = tmp_path / "out"
    res = lower_with_tool(LOWER, src, out, extra=preset.flags(), timeout=1800)
    assert res.ok, f"{res.stage}: {res.message}"

    aie = next(out.glob("aie.*.mlir")).read_text()
    flows = re.findall(r"aie\.flow\(%(\w+), DMA : \d+, %(\w+), DMA : \d+\)", aie)
    cores = {d for s, d in flows if s.startswith("shim") and d.startswith("tile_")}
    assert len(cores) == p.herd
    assert len([1 for s, d in flows if s.startswith("shim") and d in cores]) == p.herd        # x, one per tile
    assert len([1 for s, d in flows if s in cores and d.startswith("shim")]) == p.herd        # y, one per tile

    placed = (out / "input_with_addresses.mlir").read_text()
    bufs = set(re.findall(r"aie\.buffer\(%(tile_\d+_\d+)\) \{[^}]*sym_name = \"(\w+)\"\} : memref<([^>]*)>", placed))
    per_tile = Counter(t for t, _, _ in bufs)             # cores (the memory tile's are on mem_tile_*)
    assert len(per_tile) == p.herd
    mine = sorted(ty for t, _, ty in bufs if t == sorted(per_tile)[0])
    want = []
    for name, total in p.l1_buffers().items():
        one, (ty, esize) = _one(p, name), TYPES[name]
        want += [f"{one // esize}x{ty}, 2 : i32"] * (total // one)
    want.sort()
    assert mine == want, (mine, want)


def _one(p, name) -> int:
    """Bytes of one copy of an L1 buffer of the plan."""
    from kernel_builder.planner import pingpong_copies
    if p.single or (p.xwhole and name == "x") or name not in ("x", "w"):
        return p.l1_buffers()[name]
    copies = pingpong_copies(p.blocks_per_tile if p.chunks == 1 else p.chunks)
    return p.l1_buffers()[name] // copies
