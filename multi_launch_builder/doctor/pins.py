"""The commits of the installed mlir-air / mlir-aie (and of the `$LLAMA_NPU_AIR_LOWER` lowering tool) against the
pinned pair (kernel_builder/toolchain_pins.py): ✓ the pinned commit, – not discoverable, ✗ another commit.

Where a commit is discoverable:
- a wheel's version: `<release>.<YYYYMMDDHH>+<commit>` (mlir-air's and mlir-aie's utils/*_wheels/setup.py);
- a source build: the git checkout that holds the aircc / aiecc binary (`git rev-parse HEAD`);
- a lowering tool: a `COMMITS` file beside it, lines `mlir-air <hash>` and `mlir-aie <hash>` (what the recipe in
  docs/verification.md, "Real lowering", writes).
"""
from __future__ import annotations

import os
from pathlib import Path

from kernel_builder.toolchain_pins import BY_PROJECT, DIFFERENT, MATCH, UNKNOWN, commit_of_version, compare, pin_text
from multi_launch_builder.doctor.check_report import FAIL, OK, SKIP, SYMBOLS, Check

from multi_launch_builder.compile.lowering import LOWER_ENV, tool_commits

from .machine import Machine

_MARK = {MATCH: SYMBOLS[OK], UNKNOWN: SYMBOLS[SKIP], DIFFERENT: SYMBOLS[FAIL]}


def _git_head(m: Machine, tool: str | None) -> str | None:
    """HEAD of the git checkout holding `tool` (a source build's bin/ lies inside or beside it), else None."""
    if not tool:
        return None
    p = Path(os.path.realpath(tool)).parent
    for d in [p, *p.parents][:6]:
        if (d / ".git").exists():
            r = m.run(["git", "-C", str(d), "rev-parse", "HEAD"])
            return r.stdout.strip() if r.ok else None
    return None


def discovered(m: Machine) -> list[tuple[str, str, str | None]]:
    """(where, project, commit or None) for every installed piece: the toolchain's mlir-air and mlir-aie, and the
    lowering tool's pair."""
    tc = m.tools()
    out = []
    for project, tool, dists in (("mlir-air", tc.aircc, ("mlir_air", "mlir-air")),
                                 ("mlir-aie", tc.aiecc, ("mlir_aie", "mlir-aie", "mlir_aie_no_rtti"))):
        if not tool:
            continue
        wheel = m.dist_first(*dists)
        if wheel is not None:
            out.append((f"{wheel.name} {wheel.version}", project, commit_of_version(wheel.version)))
        else:
            out.append((f"source build {tool}", project, _git_head(m, tool)))
    tool = m.env.get(LOWER_ENV, "").strip()
    if tool:
        found = tool_commits(tool)
        for project in BY_PROJECT:
            out.append((f"${LOWER_ENV}", project, found.get(project)))
    return out


def check_lowering_pins(m: Machine, f=None) -> Check:
    found = discovered(m)
    pinned = pin_text()
    if not found:
        return Check("toolchain-pins", "toolchain pins", SKIP,
                     f"no mlir-air/mlir-aie installed and ${LOWER_ENV} not set (pinned: {pinned})")
    rows = [(where, project, commit, compare(project, commit)) for where, project, commit in found]
    detail = "; ".join(f"{_MARK[v]} {project} {commit[:9] if commit else 'commit unknown'} ({where})"
                       for where, project, commit, v in rows)
    data = {"pinned": {p: BY_PROJECT[p].commit for p in BY_PROJECT},
            "found": [{"where": w, "project": p, "commit": c, "verdict": v} for w, p, c, v in rows]}
    verdicts = {v for *_, v in rows}
    if DIFFERENT in verdicts:
        return Check("toolchain-pins", "toolchain pins", FAIL, f"{detail}; pinned: {pinned}",
                     fix=f"install mlir-air and mlir-aie built at the pinned commits ({pinned}), or rebuild the "
                         f"lowering tool at them (docs/verification.md#real-lowering); modules are only checked "
                         f"against that pair", anchor="mlir-air", blocking=False, data=data)
    status = OK if MATCH in verdicts else SKIP
    return Check("toolchain-pins", "toolchain pins", status, f"{detail}; pinned: {pinned}", data=data)
