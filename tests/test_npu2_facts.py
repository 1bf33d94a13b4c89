"""One NPU2 facts table (kernel_builder/hw/facts.py): no other module defines an NPU2 figure of its own. A
module-level name that sounds like hardware (columns, memory tiles, shim, BDs, channels, lanes, mmul, stack,
cores, repeats) must not be bound to a number literal, and no module-level constant may hold one of the table's
distinctive sizes; they read kernel_builder.hw.facts.NPU2 instead. Planning choices that are not hardware
figures are listed below with the reason."""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LAYERS = ("external_kernels", "kernel_builder", "multi_launch_builder", "llama_npu")
FACTS = ROOT / "kernel_builder" / "hw" / "facts.py"
HW_WORDS = re.compile(r"NPU2|COLS\b|_ROWS\b|MEMTILE|SHIM|_BDS\b|CHANNEL|L1_BYTES|LANES|MMUL|STACK|CORES\b|"
                      r"REPEAT|HW_CONTEXT")
# name -> why it is a planning choice, not an NPU2 figure
POLICY = {
    "L1_STACK_RESERVE": "planner: L1 kept out of the data budget for the stack and kernel scratch",
    "MAX_GEMM_PUT_BDS": "GEMM plan: BDs one panel broadcast may take, leaving the channel group's rest to others",
    "STACK_STEP": "hw.tune: granularity of the stack size it proposes",
    "_CORES": "host_threads: threads of the host CPU's pool, not NPU cores",
}
KIB = 1024
DISTINCTIVE = {64 * KIB: "core_memory_bytes", 512 * KIB: "memtile_bytes", 1152: "soft_float_div_stack_bytes"}


def _literal_value(node: ast.AST, env: dict[str, int]):
    """The value of an expression of int literals and already-bound literal names, else None."""
    try:
        return eval(compile(ast.Expression(node), "<const>", "eval"), {"__builtins__": {}}, dict(env))  # noqa: S307
    except Exception:
        return None


def figures_outside_the_table(paths) -> list[str]:
    out = []
    for path in paths:
        env: dict[str, int] = {}
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.Assign):
                targets, value = node.targets, node.value
            elif isinstance(node, ast.AnnAssign) and node.value is not None:
                targets, value = [node.target], node.value
            else:
                continue
            names = [n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)]
            literal = any(isinstance(n, ast.Constant) and isinstance(n.value, (int, float))
                          and not isinstance(n.value, bool) for n in ast.walk(value))
            v = _literal_value(value, env)
            for name in names:
                where = f"{path.relative_to(ROOT)}: {name}"
                if literal and HW_WORDS.search(name) and name not in POLICY:
                    out.append(f"{where} = {ast.unparse(value)}")
                elif isinstance(v, int) and not isinstance(v, bool) and v in DISTINCTIVE:
                    out.append(f"{where} = {v} (NPU2.{DISTINCTIVE[v]})")
                if isinstance(v, int):
                    env[name] = v
    return out


def _modules():
    return [p for layer in LAYERS for p in sorted((ROOT / layer).rglob("*.py")) if p != FACTS]


def test_npu2_figures_live_only_in_the_facts_table():
    assert figures_outside_the_table(_modules()) == []


@pytest.mark.parametrize("source,hit", [
    ("NPU2_COLS = 8\n", "NPU2_COLS = 8"),
    ("KiB = 1024\nMEMTILE_BYTES = 512 * KiB\n", "MEMTILE_BYTES = 512 * KiB"),
    ("SHIM_DMA_PER_COL = 2\n", "SHIM_DMA_PER_COL = 2"),
    ("KiB = 1024\nBUDGET = 64 * KiB\n", "BUDGET = 65536 (NPU2.core_memory_bytes)"),
    ("from kernel_builder.hw.facts import NPU2\nNPU2_COLS = NPU2.columns\n", None),
])
def test_the_scan_finds_a_figure_defined_elsewhere(tmp_path, source, hit):
    mod = ROOT / "tests" / f"_scan_probe_{tmp_path.name}.py"
    try:
        mod.write_text(source)
        found = figures_outside_the_table([mod])
    finally:
        mod.unlink()
    assert found == ([] if hit is None else [f"tests/{mod.name}: {hit}"])


def test_planners_and_kernels_read_the_table():
    from kernel_builder import planner
    from kernel_builder.attention import external as attention_ext
    from kernel_builder.gemv import external as gemv_ext, plan as gemv_plan
    from kernel_builder.hw.facts import NPU2

    assert planner.NPU2_COLS == NPU2.columns and planner.MEMTILE_BYTES == NPU2.memtile_bytes
    assert gemv_plan.GEMV_MAX_TILES == NPU2.columns * NPU2.shim_mm2s
    assert gemv_ext.GEMV_K_MULTIPLE == NPU2.vector_lanes_bf16 and attention_ext.ATTN_LK_MULTIPLE == 16
