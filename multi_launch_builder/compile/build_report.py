"""What a build returns: one ModuleResult per module (status, key, per-stage times, artifact, hardware
report) in a BuildReport whose table() is the compile table; BuildError names every failed module."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ..devices.base import Artifact

STAGES = ("generate", "stitch", "externals", "check", "aircc", "aiecc")


class BuildError(RuntimeError):
    def __init__(self, message: str, report: "BuildReport | None" = None):
        super().__init__(message)
        self.report = report


@dataclass
class ModuleResult:
    name: str
    status: str                     # "built" | "skipped" | "failed"
    key: str = ""
    times: dict = field(default_factory=dict)
    artifact: Artifact | None = None
    error: str = ""
    notes: list[str] = field(default_factory=list)
    hw: object = None               # kernel_builder.hw.ModuleReport (None when the model could not read it)


@dataclass
class BuildReport:
    device_kind: str
    cache_dir: Path
    results: list[ModuleResult] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(r.status != "failed" for r in self.results)

    @property
    def artifacts(self) -> dict[str, Artifact]:
        return {r.name: r.artifact for r in self.results if r.artifact is not None}

    def by_status(self, status: str) -> list[str]:
        return [r.name for r in self.results if r.status == status]

    def table(self) -> str:
        w = max([len("module")] + [len(r.name) for r in self.results])
        head = f"{'module':<{w}}  {'status':<7}" + "".join(f"  {s:>9}" for s in STAGES) + f"  {'total':>8}"
        lines = [head, "-" * len(head)]
        for r in self.results:
            cells = []
            for s in STAGES:
                v = r.times.get(s)
                cells.append(f"  {'-':>9}" if v is None else f"  {v:9.3f}")
            total = sum(v for v in r.times.values() if v)
            lines.append(f"{r.name:<{w}}  {r.status:<7}" + "".join(cells) + f"  {total:8.3f}")
        lines.append(f"{len(self.by_status('built'))} built, {len(self.by_status('skipped'))} up to date, "
                     f"{len(self.by_status('failed'))} failed  (device {self.device_kind}, cache {self.cache_dir})")
        for r in self.results:
            if r.error:
                lines.append(f"FAILED {r.name}: {r.error}")
        lines += [f"note: {n}" for n in self.notes]
        from kernel_builder.hw.module_report import build_summary

        from ..devices.npu import DEFAULT_MAX_CONTEXTS   # the runtime's limit of loaded modules (hardware contexts)
        lines += build_summary(self.results, self.device_kind, max_loaded=DEFAULT_MAX_CONTEXTS)
        return "\n".join(lines)

    __str__ = table
