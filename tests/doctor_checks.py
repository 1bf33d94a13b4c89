"""Shared checks of the `llama-npu doctor` tests: run the checks on a fake machine, and assert that exactly one
check fails with a fix sentence and a docs/npu-setup.md section."""
from __future__ import annotations

import re
from pathlib import Path

from multi_launch_builder.doctor import FAIL, MemoryNeed, exit_code, render_text, run_checks
from doctor_fakes import MIB

ROOT = Path(__file__).resolve().parents[1]
NEED = MemoryNeed("test model", 600 * MIB, {"weights": 500 * MIB}, reduce_hint="use fewer BUCKETS=")


def _anchors() -> set[str]:
    out = set()
    for line in (ROOT / "docs" / "npu-setup.md").read_text().splitlines():
        m = re.match(r"#+\s+(.*)", line)
        if m:
            out.add(re.sub(r"[^\w\- ]", "", m[1].strip().lower()).replace(" ", "-"))
    return out


ANCHORS = _anchors()


def checks_of(fm, need=NEED, cache_dir=None, decls=None):
    checks = run_checks(fm.machine(), need, cache_dir, decls)
    return {c.id: c for c in checks}, checks


def only_failure(fm, cid, **kw):
    """The machine fails exactly check `cid` (plus the ones named in also=...); returns that check."""
    also = set(kw.pop("also", ()))
    by_id, checks = checks_of(fm, **kw)
    failed = {c.id for c in checks if c.status == FAIL}
    assert failed == {cid} | also, render_text(checks)
    c = by_id[cid]
    assert c.anchor in ANCHORS, (c.id, c.anchor)
    text = render_text(checks)
    assert f"fix: {c.fix}" in text and f"docs/npu-setup.md#{c.anchor}" in text
    assert exit_code(checks) == (1 if c.blocking or any(by_id[a].blocking for a in also) else 0)
    return c

