"""ModuleReport (what `analyze_module` returns), the one-row-per-module table `llama-npu compile` prints, the
build-time gate and `llama-npu hw-check FILE.mlir ...`."""
from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field
from pathlib import Path

from kernel_builder.hw import cost as cost_mod
from kernel_builder.hw.analyze import analyze_launches
from kernel_builder.hw.results import AIECC, STAGES, LaunchReport, Usage, Violation
from kernel_builder.hw.facts import NPU2, NPU2Facts
from kernel_builder.hw.ir import HwParseError


@dataclass
class ModuleReport:
    name: str
    launches: list[LaunchReport]
    violations: list[Violation] = field(default_factory=list)   # every violation, in lowering order
    params: cost_mod.CostParams = cost_mod.PARAMS

    @property
    def ok(self) -> bool:
        return not self.violations

    def first_violation(self) -> str | None:
        """The violation the real lowering would hit first, as one line (None when the module fits)."""
        return self.violations[0].one_line() if self.violations else None

    @property
    def usage(self) -> Usage:
        """Per resource, the most any launch uses (launches run one after the other on the whole array)."""
        out = Usage()
        for la in self.launches:
            out = out.merge_max(la.usage)
        return out

    @property
    def modeled_s(self) -> float:
        return cost_mod.module_seconds([la.work for la in self.launches], self.params)

    @property
    def modeled_ms(self) -> float:
        return self.modeled_s * 1e3

    @property
    def scalar_share(self) -> float:
        v = sum(la.work.vector_macs for la in self.launches)
        s = sum(la.work.scalar_macs for la in self.launches)
        return s / (v + s) if v + s else 0.0

    def resources(self) -> set[str]:
        """{"<tile> <resource>"} of every violation (what the pinned-verdict test compares)."""
        return {f"{v.tile} {v.resource}" for v in self.violations}


def analyze_module(text: str, name: str | None = None, preset=None, facts: NPU2Facts = NPU2,
                   params: cost_mod.CostParams | None = None) -> ModuleReport:
    """Check a module text against the NPU2 facts and estimate its time. `name` names the module in messages
    (default: the public func's name); `preset` (ping-pong omission, stack size, runtime loop tiling) defaults
    to the one a stitched text records in its header. Raises HwParseError (one line) for unreadable text."""
    name, launches = analyze_launches(text, name, preset, facts)
    params = params or cost_mod.PARAMS
    for la in launches:
        la.modeled_ms = cost_mod.launch_cost(la.work, params).total_s * 1e3
    violations = sorted([v for la in launches for v in la.violations] + sequence_bd_leaks(name, launches, facts),
                        key=lambda v: (STAGES.index(v.stage), v.launch, v.line))
    return ModuleReport(name, launches, violations, params)


def sequence_bd_leaks(name: str, launches: list[LaunchReport], facts: NPU2Facts = NPU2) -> list[Violation]:
    """The shim BDs a module's launches leave allocated, added up over its runtime sequence: aiecc inlines every
    launch's sequence into one (aie-materialize-runtime-sequences) before aie-assign-runtime-sequence-bd-ids
    gives each shim tile's tasks their 16 BD IDs, freeing one only at its task's wait; a task that airrt-to-npu
    split (dma.wrap_split) has waits for only its first part. So the parts left over accumulate from launch to
    launch, and a later launch that fits on its own runs out ("Allocator exhausted available buffer descriptor
    IDs": a two-layer decode token whose attention's split query-row reads left 6 BDs per layer on 4 shim tiles,
    then 8 held by the next GEMV; docs/hardware-model.md "Shim BD folding")."""
    leaked: dict[int, int] = {}
    for la in launches:
        for col, held in sorted(la.usage.seq_bds_by_column.items()):
            before = leaked.get(col, 0)
            if before and before + held > facts.shim_bds:
                return [Violation(name, la.index, la.name, "shim", "BDs", before + held, facts.shim_bds, AIECC,
                                  "rule", f"column {col}: {before} BDs left allocated by earlier launches' split DMA "
                                  f"tasks (airrt-to-npu tileIllegalWrapDim splits a task after its waits were made; "
                                  f"the extra parts are never freed) + {held} this launch holds at once")]
        for col, n in la.usage.seq_leak.items():
            leaked[col] = leaked.get(col, 0) + n
    return []


# ------------------------------------------------------------------------------------------ table

HEADER = ("module", "shim mm2s/s2mm", "shim BDs", "memtile mm2s/s2mm", "core mm2s/s2mm", "core BDs",
          "L1 peak", "L2 peak", "scalar", "modeled ms", "")


def _kib(n: int) -> str:
    return f"{n / 1024:.1f}K"


def row(rep: ModuleReport, facts: NPU2Facts = NPU2, note: str = "") -> tuple[str, ...]:
    u = rep.usage
    ms = rep.modeled_ms
    return (rep.name,
            f"{u.shim_mm2s}/{u.shim_s2mm} of {facts.shim_mm2s_total}",
            f"{u.shim_bds}/{facts.shim_bds}",
            f"{u.memtile_mm2s}/{u.memtile_s2mm} of {facts.memtiles * facts.memtile_mm2s}",
            f"{u.core_mm2s}/{u.core_s2mm} of {facts.core_mm2s}",
            f"{u.core_bds}/{facts.core_bds}",
            f"{_kib(u.l1_bytes)}/{_kib(facts.core_memory_bytes)}",
            f"{_kib(u.l2_bytes)}/{_kib(facts.memtiles * facts.memtile_bytes)}",
            f"{rep.scalar_share * 100:.0f}%",
            f"{ms:,.1f}" if ms < 1e6 else f"{ms:.3g}",
            note or ("ok" if rep.ok else "OVER"))


def table(rows: list[tuple[str, ...]]) -> str:
    rows = [HEADER] + rows
    widths = [max(len(r[i]) for r in rows) for i in range(len(HEADER))]
    lines = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) if i < len(HEADER) - 1 else c
                       for i, (c, w) in enumerate(zip(r, widths))).rstrip() for r in rows]
    lines.insert(1, "-" * len(lines[0]))
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------ build gate

class HwCheckError(RuntimeError):
    """A module over an NPU2 limit, compiled for the NPU: the message is the first violation (one line)."""


def gate(name: str, text: str, target: str, enforce: bool = True, preset=None) -> tuple[ModuleReport | None, str]:
    """The build driver's check: (report, note). On the NPU target a module over a limit raises HwCheckError
    with one line (unless enforce=False); on emu/null it returns a note (the row is marked, a warning is
    printed by the caller) so emulated runs keep working. Text the model cannot read gives a note, never a
    failure (the hardware model must not block a build it cannot judge)."""
    try:
        rep = analyze_module(text, name, preset)
    except HwParseError as e:
        return None, f"hw model: cannot analyze {name}: {e}"
    except Exception as e:  # a model bug must not block a build: say so in one line
        return None, f"hw model: internal error analyzing {name}: {type(e).__name__}: {e}"
    if rep.ok:
        return rep, ""
    line = rep.first_violation()
    if target == "npu" and enforce:
        raise HwCheckError(f"{line} (--no-hw-check to compile anyway)")
    return rep, f"hw model: {line}"


def build_summary(results, device_kind: str, facts: NPU2Facts = NPU2, max_loaded: int | None = None) -> list[str]:
    """The lines `llama-npu compile` appends to its report: one table row per module (channels and BDs per
    tile type against the chip, L1/L2 peak, scalar share, modeled ms), one warning line when modules exceed
    a limit on an emulated device, and the hardware-context budget of the module set."""
    reps = [r for r in results if getattr(r, "hw", None) is not None]
    if not reps:
        return []
    out = ["", f"NPU2 hardware model (docs/hardware-model.md; modeled with {cost_mod.__name__}.PARAMS):",
           table([row(r.hw) for r in reps])]
    over = [r.hw for r in reps if not r.hw.ok]
    if over and device_kind != "npu":
        out.append(f"warning: {len(over)} of {len(reps)} modules exceed NPU2 limits (first: "
                   f"{over[0].first_violation()}); {device_kind} runs them anyway, DEVICE=npu refuses them "
                   f"(--no-hw-check to try)")
    n = len(results)
    if n > facts.hw_contexts_comfortable:
        keeps = f"the runtime keeps at most {max_loaded} loaded" if max_loaded else "the runtime keeps fewer loaded"
        out.append(f"note: {n} modules would be {n} hardware contexts if all were loaded at once (the driver allows "
                   f"{facts.hw_contexts} per device); {keeps}, unloading the least recently used one "
                   f"(LLAMA_NPU_MAX_CONTEXTS; docs/cache.md)")
    return out


# ------------------------------------------------------------------------------------------ hw-check CLI

MAX_MODULE_MIB = 64.0   # the stitched modules of a 3B model are a few MiB; a bigger file is not one of ours


def read_module_file(path: Path, max_mib: float = MAX_MODULE_MIB) -> str:
    """The text of a module file; HwParseError (one line) when it is over the size cap or not UTF-8 (the
    analysis holds a few times the file in memory and takes about a second per MiB)."""
    size = path.stat().st_size
    if size > max_mib * 2**20:
        raise HwParseError(f"{size} bytes ({size / 2**20:.1f} MiB) is over the {max_mib:g} MiB limit for a module file "
                           f"(--max-mib to raise it)")
    data = path.read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise HwParseError(f"not UTF-8 text (byte 0x{data[e.start]:02x} at offset {e.start}, line {line})") from None


def hw_check_main(argv: list[str] | None = None) -> int:
    """`llama-npu hw-check FILE.mlir ...`: one table row per file, one line per violation; exit 1 when a
    module is over a limit, 2 when a file cannot be read or analysed (one line, no traceback)."""
    p = argparse.ArgumentParser(prog="llama-npu hw-check",
                                description="check AIR module files against the NPU2 hardware model")
    p.add_argument("files", nargs="+", type=Path)
    p.add_argument("--name", default=None, help="module name shown in the report (default: the file's stem); "
                   "the aircc preset is the one the stitched text records in its header")
    p.add_argument("--max-mib", type=float, default=MAX_MODULE_MIB,
                   help=f"refuse files larger than this (default {MAX_MODULE_MIB:g} MiB)")
    args = p.parse_args(argv)
    rows, lines, status = [], [], 0
    for path in args.files:
        try:
            text = read_module_file(path, args.max_mib)
        except OSError as e:
            print(f"llama-npu hw-check: {path}: {e.strerror or e}", file=sys.stderr)
            return 2
        except HwParseError as e:
            print(f"llama-npu hw-check: {path}: {e}", file=sys.stderr)
            return 2
        try:
            rep = analyze_module(text, args.name or path.stem)
        except HwParseError as e:
            print(f"llama-npu hw-check: {path}: {e}", file=sys.stderr)
            return 2
        rows.append(row(rep))
        lines += [v.one_line() for v in rep.violations]
        if not rep.ok:
            status = 1
    print(table(rows))
    for line in lines:
        print(line)
    return status
