"""The mlir-air / mlir-aie commits our modules are checked against: the one place that names them.

`llama-npu doctor` compares the installed toolchain's commits with these, `llama-npu check-lowering` prints
them above its table, and tests/test_toolchain_pins.py checks that every commit docs/ cite for mlir-air or
mlir-aie is one of these (or the older pair named below, which docs describe as such).

The modules checked with this pair, and what lowered up to the NPU instructions: docs/verification.md, "Real
lowering". mlir-aie's commit is the one mlir-air's
utils/clone-mlir-aie.sh pins at that mlir-air commit (its wheel: mlir_aie 0.0.1.2026041305+ae8ed9d).
"""
from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Pin:
    project: str        # "mlir-air" | "mlir-aie"
    repo: str           # where the commit lives on GitHub
    commit: str         # full hash
    date: str           # commit date (UTC)
    subject: str

    @property
    def short(self) -> str:
        return self.commit[:9] if self.project == "mlir-air" else self.commit[:7]


PINS = (
    Pin("mlir-air", "Xilinx/mlir-air", "efeb41ce47fa2f5b622b02f304112701671beea0", "2026-04-30",
        'Add channel_type="mmio" for runtime-sequence MMIO writes (#1568)'),
    Pin("mlir-aie", "Xilinx/mlir-aie", "ae8ed9dac665a4bc2668399a91a4fdf0b34d177a", "2026-04-10",
        "feat(trace): lateral routing and S2MM channel distribution for InsertTraceFlows (#3001)"),
)
BY_PROJECT = {p.project: p for p in PINS}

# The March 2026 pair: it builds, but rejects the gemv, the LM head and a 576x576 GEMM ("failed to specialize
# channel bundle indices"); docs name it only as the pair that does not work.
OLDER_PAIR = {"mlir-air": "ec7d2f0bbf604e23788ba826beb835aec17dab66",
              "mlir-aie": "c5d4befdce2bef7a9219b742000cb2f8d9283f39"}

MATCH, UNKNOWN, DIFFERENT = "match", "unknown", "different"
_HEX = re.compile(r"^[0-9a-f]{7,40}$")
# wheel versions of both projects: <release>.<YYYYMMDDHH>+<7-hex commit>[_no_rtti | -no_rtti]
# (utils/mlir_air_wheels/setup.py and utils/mlir_aie_wheels/setup.py, get_version)
_WHEEL_COMMIT = re.compile(r"\+([0-9a-f]{7,40})(?:[_-]no[_-]rtti)?$")


def pin_text() -> str:
    """`mlir-air efeb41ce4 + mlir-aie ae8ed9d`."""
    return " + ".join(f"{p.project} {p.short}" for p in PINS)


def commit_of_version(version: str | None) -> str | None:
    """The commit a wheel version carries after its '+', else None ('1.2.3', a release without a hash)."""
    m = _WHEEL_COMMIT.search((version or "").strip().lower())
    return m[1] if m else None


def compare(project: str, found: str | None) -> str:
    """MATCH when `found` (a hash of at least 7 hex digits, short or full) names the pinned commit, UNKNOWN when
    nothing was found, DIFFERENT otherwise."""
    if not found:
        return UNKNOWN
    found = found.strip().lower()
    if not _HEX.match(found):
        return UNKNOWN
    pinned = BY_PROJECT[project].commit
    return MATCH if pinned.startswith(found) else DIFFERENT
