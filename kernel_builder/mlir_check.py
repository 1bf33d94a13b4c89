"""Host check of generated module text with upstream `mlir-opt-22` (non-AIR parts only).

mlir-opt-22 cannot parse AIR's custom syntax, so each `air.herd` body (read from the one AIR reader's tree,
kernel_builder.air_module) is lifted into a plain `func.func` whose arguments are the herd's tile ids, sizes
and operands; AIR ops without results (DMAs, channel puts/gets, terminators; inside loops too) are dropped,
and module-level `air.channel` declarations are not copied (a herd's `air.channel.get` only fills an L1 buffer
that the remaining ops already type-check).
What remains — arith/scf/memref/linalg/vector and calls to the private external kernel declarations — is
parsed and verified for real.
"""
from __future__ import annotations

import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from kernel_builder import air_module

MLIR_OPT = "mlir-opt-22"


@dataclass
class CheckResult:
    ok: bool
    checked_herds: int = 0
    notes: list[str] = field(default_factory=list)
    stderr: str = ""


def _herds(tree):
    """Every `air.herd` of the module's public func (inside launches and segments)."""
    def rec(ops):
        for op in ops:
            if op.name == "air.herd":
                yield op
            elif op.name in ("air.launch", "air.segment", "scf.for"):
                yield from rec(op.body)
    return rec(tree.body)


def _air_ops(ops):
    """The AIR ops inside a herd body (at any depth: a DMA inside an scf.for too)."""
    for op in ops:
        if op.name.startswith("air."):
            yield op
        elif op.span is not None:
            yield from _air_ops(op.body)


def herd_functions(text: str) -> tuple[list[str], list[str]]:
    """(func texts, notes): one upstream-parseable func per air.herd of `text` (read from the one AIR reader's
    tree, kernel_builder.air_module). ValueError for text the reader cannot read."""
    tree = air_module.read(text)
    lines = text.splitlines()
    funcs, notes = [], []
    for herd in _herds(tree):
        try:
            air = herd.air
        except ValueError as e:
            notes.append(f"line {herd.line}: air.herd header not understood ({e}); not checked")
            continue
        if air.region is None:
            continue
        drop, bad = set(), None
        for op in _air_ops(herd.body):
            if op.results:
                bad = f"line {op.line}: AIR op with results inside the herd; not checked"
                break
            drop.update(range(op.line, tree.line_of(op.end - 1) + 1))
        if bad:
            notes.append(bad)
            continue
        first = tree.line_of(herd.start + air.region[0]) + 1           # the line after the region's `{`
        last = tree.line_of(herd.start + air.region[1] - 1) - 1        # the line before its `}`
        body = [lines[i - 1] for i in range(first, last + 1) if i not in drop]
        params = [f"%{v}: index" for v in list(air.ids) + [s for s, _ in air.sizes]] + \
            [f"%{v}: {t}" for (v, _), t in zip(air.args, air.arg_types)]
        funcs.append(f"  func.func @llama_npu_herd_{len(funcs)}({', '.join(params)}) {{\n"
                     + "\n".join(body) + "\n    return\n  }")
    return funcs, notes


def check_text(text: str, tool: str | None = None, timeout: float = 120.0) -> CheckResult:
    """Verify the non-AIR parts of `text`. Without mlir-opt-22 it returns ok with a note."""
    tool = tool or shutil.which(MLIR_OPT)
    if not tool:
        return CheckResult(True, notes=[f"{MLIR_OPT} not found; module text not checked"])
    try:
        decls = [d.text.strip() for d in air_module.read(text).layout.private_decls()]
        funcs, notes = herd_functions(text)
    except ValueError as e:
        return CheckResult(False, 0, [], f"module text not readable: {e}")
    if not funcs:
        return CheckResult(True, 0, notes + ["no air.herd bodies found to check"])
    module = "module {\n" + "\n".join("  " + d for d in decls) + "\n" + "\n".join(funcs) + "\n}\n"
    with tempfile.NamedTemporaryFile("w", suffix=".mlir", delete=False) as f:
        f.write(module)
        path = f.name
    try:
        r = subprocess.run([tool, path, "-o", "/dev/null"], capture_output=True, text=True, timeout=timeout)
    finally:
        Path(path).unlink(missing_ok=True)
    return CheckResult(r.returncode == 0, len(funcs), notes, r.stderr.strip())
