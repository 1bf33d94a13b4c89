"""One result per check, printed as one line (✓ / ✗ / –) plus, for a ✗, one fix sentence with the
docs/npu-setup.md section; `--json` prints the same data for scripts."""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

SETUP_DOC = "docs/npu-setup.md"
OK, FAIL, SKIP = "ok", "fail", "skip"
SYMBOLS = {OK: "✓", FAIL: "✗", SKIP: "–"}


@dataclass
class Check:
    id: str                 # stable key for scripts, e.g. "device-node"
    title: str              # shown in the first column
    status: str             # ok | fail | skip
    detail: str             # one line: what was found
    fix: str = ""           # one sentence, for a failure
    anchor: str = ""        # section of docs/npu-setup.md that explains the fix
    blocking: bool = True   # a blocking failure means the NPU path cannot work (exit 1)
    data: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.status not in SYMBOLS:
            raise ValueError(f"check {self.id}: unknown status {self.status!r}")
        if self.status == FAIL and not self.fix:
            raise ValueError(f"check {self.id}: a failure needs a fix sentence")

    @property
    def doc(self) -> str:
        return f"{SETUP_DOC}#{self.anchor}" if self.anchor else ""

    def lines(self, width: int = 16) -> list[str]:
        head = f"{SYMBOLS[self.status]} {self.title:<{width}} {self.detail}"
        if self.status != FAIL:
            return [head]
        tail = f" ({self.doc})" if self.doc else ""
        note = "" if self.blocking else " [advisory: does not stop the NPU path]"
        return [head, f"    fix: {self.fix}{tail}{note}"]


def ready(checks: list[Check]) -> bool:
    return not any(c.status == FAIL and c.blocking for c in checks)


def exit_code(checks: list[Check]) -> int:
    return 0 if ready(checks) else 1


def render_text(checks: list[Check], header: str = "") -> str:
    width = max([16] + [len(c.title) for c in checks])
    out = [header] if header else []
    for c in checks:
        out += c.lines(width)
    blocking = [c.title for c in checks if c.status == FAIL and c.blocking]
    advisory = [c.title for c in checks if c.status == FAIL and not c.blocking]
    if blocking:
        out.append(f"NPU path: NOT ready — {len(blocking)} problem(s): {', '.join(blocking)}")
    else:
        extra = f" ({len(advisory)} advisory: {', '.join(advisory)})" if advisory else ""
        out.append("NPU path: ready" + extra)
    return "\n".join(out)


def render_json(checks: list[Check], extra: dict | None = None) -> str:
    rows = []
    for c in checks:
        row = asdict(c)
        row["symbol"] = SYMBOLS[c.status]
        row["doc"] = c.doc
        rows.append(row)
    doc = {"ready": ready(checks), "exit_code": exit_code(checks), "checks": rows}
    if extra:
        doc.update(extra)
    return json.dumps(doc, indent=1, sort_keys=False, default=str)


def fmt_bytes(n: float | int | None) -> str:
    if n is None:
        return "?"
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"  # pragma: no cover
