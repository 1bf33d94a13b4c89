"""Host check of generated module text with upstream `mlir-opt-22` (non-AIR parts only).

mlir-opt-22 cannot parse AIR's custom syntax, so each `air.herd` body is lifted into a plain
`func.func` whose arguments are the herd's tile ids, sizes and operands; AIR ops without results
(DMAs, channel puts/gets, terminators) are dropped, and module-level `air.channel` declarations are not
copied (a herd's `air.channel.get` only fills an L1 buffer that the remaining ops already type-check).
What remains — arith/scf/memref/linalg/vector and calls to the private external kernel declarations — is
parsed and verified for real.
"""
from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

MLIR_OPT = "mlir-opt-22"

_HEADER = re.compile(
    r"air\.herd\s+(?:@[\w.$-]+\s+)?(?:async\s*(?:\[[^\]]*\]\s*)?)?tile\s*\((?P<ids>[^)]*)\)\s*in\s*\((?P<sizes>[^)]*)\)"
    r"\s*(?:args\s*\((?P<args>[^)]*)\))?\s*(?::\s*(?P<types>.*?))?\s*(?:attributes\s*\{.*\})?\s*\{\s*$")


@dataclass
class CheckResult:
    ok: bool
    checked_herds: int = 0
    notes: list[str] = field(default_factory=list)
    stderr: str = ""


def _split_top(s: str) -> list[str]:
    """Split on commas that are not inside <>, (), [] or {}."""
    out, depth, cur = [], 0, []
    for ch in s:
        if ch in "<([{":
            depth += 1
        elif ch in ">)]}":
            depth -= 1
        if ch == "," and depth == 0:
            out.append("".join(cur).strip())
            cur = []
        else:
            cur.append(ch)
    if "".join(cur).strip():
        out.append("".join(cur).strip())
    return out


def _braces(line: str) -> int:
    line = re.sub(r'"(?:[^"\\]|\\.)*"', "", line)
    return line.count("{") - line.count("}")


def herd_functions(text: str) -> tuple[list[str], list[str]]:
    """(func texts, notes): one upstream-parseable func per air.herd of `text`."""
    lines = text.splitlines()
    funcs, notes = [], []
    i = 0
    n = 0
    while i < len(lines):
        line = lines[i]
        if "air.herd" not in line or not line.rstrip().endswith("{"):
            i += 1
            continue
        m = _HEADER.search(line)
        if not m:
            notes.append(f"line {i + 1}: air.herd header not understood; not checked")
            i += 1
            continue
        ids = [x.strip() for x in m["ids"].split(",") if x.strip()]
        sizes = [x.split("=")[0].strip() for x in m["sizes"].split(",") if x.strip()]
        operands = [x.split("=")[0].strip() for x in _split_top(m["args"] or "")]
        types = _split_top(m["types"] or "") if operands else []
        depth = _braces(line)
        body, j, bad = [], i + 1, None
        while j < len(lines) and depth > 0:
            d = _braces(lines[j])
            if depth + d <= 0:  # the herd's closing brace
                break
            s = lines[j].strip()
            if re.match(r"(%[\w#:, ]+=\s*)air\.", s):
                bad = f"line {j + 1}: AIR op with results inside the herd; not checked"
            elif not s.startswith("air."):
                body.append(lines[j])
            depth += d
            j += 1
        i = j + 1
        if bad or len(types) != len(operands):
            notes.append(bad or f"herd at line {m.string and i}: operand/type count mismatch; not checked")
            continue
        params = [f"{v}: index" for v in ids + sizes] + [f"{v}: {t}" for v, t in zip(operands, types)]
        funcs.append(f"  func.func @llama_npu_herd_{n}({', '.join(params)}) {{\n"
                     + "\n".join(body) + "\n    return\n  }")
        n += 1
    return funcs, notes


def check_text(text: str, tool: str | None = None, timeout: float = 120.0) -> CheckResult:
    """Verify the non-AIR parts of `text`. Without mlir-opt-22 it returns ok with a note."""
    tool = tool or shutil.which(MLIR_OPT)
    if not tool:
        return CheckResult(True, notes=[f"{MLIR_OPT} not found; module text not checked"])
    decls = [l.strip() for l in text.splitlines() if re.match(r"\s*func\.func\s+private\s+@", l)]
    funcs, notes = herd_functions(text)
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
