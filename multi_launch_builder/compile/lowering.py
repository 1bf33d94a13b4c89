"""The real lowering of stitched modules, up to the NPU instructions, as a check (nothing is kept).

Two lowerers, one result type:
- `AirccLowerer`: the installed aircc (which drives aiecc) and Peano: the linked external kernels are compiled,
  then `aircc --device npu2 --output-format none -i <insts>` must exit 0 and write the NPU instructions;
- `ToolLowerer`: a real-lowering tool with the `LLAMA_NPU_AIR_LOWER` interface (docs/verification.md, "Real
  lowering"): `TOOL --whole -q [aircc options] MODULE.mlir OUTDIR`, whose last output line is `OK ...` or
  `FAIL <stage>/<pass>: <first error>`. tests/test_air_lower_*.py drive it through `lower_with_tool`.

`find_lowerer` picks the installed toolchain, else `$LLAMA_NPU_AIR_LOWER`, else raises LoweringUnavailable
(one line: what is missing and where the docs say how to get it). `check_lowering` runs a list of modules through
one lowerer with a progress bar and returns a LoweringReport whose table() has one row per module. A `VerdictMemo`
keeps each verdict under the hash of (module text, lowerer identity), so a re-check lowers only what changed.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from kernel_builder.toolchain import Toolchain, detect

LOWER_ENV = "LLAMA_NPU_AIR_LOWER"
LOWER_DOC = "docs/verification.md#real-lowering"
DEFAULT_TIMEOUT_S = 3600.0
_FAIL = re.compile(r"^FAIL\s+(\S+?):\s*(.*)$")


class LoweringUnavailable(RuntimeError):
    """No way to lower here: one line naming what is missing and the docs section that gets it."""


@dataclass
class Lowered:
    ok: bool
    stage: str = ""        # where it failed: "<stage>/<pass>" of the tool, "aircc", "externals", "timeout", ...
    message: str = ""      # the first error (or the tool's OK line)
    seconds: float = 0.0


def parse_result(stdout: str, returncode: int | None) -> Lowered:
    """A `LLAMA_NPU_AIR_LOWER` run's verdict from its last non-empty output line."""
    lines = [ln.strip() for ln in (stdout or "").splitlines() if ln.strip()]
    last = lines[-1] if lines else ""
    if last.startswith("OK") and returncode == 0:
        return Lowered(True, message=last)
    m = _FAIL.match(last)
    if m:
        return Lowered(False, m[1], m[2])
    return Lowered(False, "?", f"exit {returncode}, no OK/FAIL line" + (f" (last line: {last})" if last else ""))


def lower_with_tool(tool: str, src: Path, outdir: Path, extra: list[str] | tuple = (),
                    timeout: float = DEFAULT_TIMEOUT_S) -> Lowered:
    """Run `tool --whole -q [extra] src outdir` (the module's `// aircc preset:` header is applied by the tool)."""
    t0 = time.perf_counter()
    try:
        r = subprocess.run([tool, "--whole", "-q", *extra, str(src), str(outdir)], capture_output=True, text=True,
                           errors="replace", timeout=timeout, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return Lowered(False, "timeout", f"no verdict within {timeout:g} s", time.perf_counter() - t0)
    except OSError as e:
        return Lowered(False, "tool", f"{tool} could not run: {e.strerror or type(e).__name__}",
                       time.perf_counter() - t0)
    res = parse_result(r.stdout, r.returncode)
    if not res.ok and res.stage == "?" and r.stderr.strip():
        res.message += f"; stderr: {r.stderr.strip().splitlines()[-1]}"
    res.seconds = time.perf_counter() - t0
    return res


def tool_commits(tool: str) -> dict[str, str]:
    """{project: commit} from the `COMMITS` file beside a lowering tool (lines `mlir-air <hash>`, `mlir-aie <hash>`)."""
    from kernel_builder.toolchain_pins import BY_PROJECT
    try:
        lines = (Path(os.path.realpath(tool)).parent / "COMMITS").read_text().splitlines()
    except OSError:
        return {}
    return {p[0]: p[1] for p in (ln.split() for ln in lines) if len(p) == 2 and p[0] in BY_PROJECT}


@dataclass
class ToolLowerer:
    tool: str
    timeout: float = DEFAULT_TIMEOUT_S

    def describe(self) -> str:
        from kernel_builder.toolchain_pins import compare
        found = tool_commits(self.tool)
        built = ", ".join(f"{p} {c[:9]} ({compare(p, c)})" for p, c in found.items()) or "commits unknown"
        return f"{self.tool} (${LOWER_ENV}; built from {built})"

    def identity(self) -> str:
        """What the verdict depends on besides the module: the tool file and the commits it was built from."""
        p = Path(os.path.realpath(self.tool))
        st = p.stat()
        return f"tool {p} {st.st_size} {st.st_mtime_ns} {sorted(tool_commits(self.tool).items())}"

    def lower(self, name: str, text: str, work: Path) -> Lowered:
        src = work / f"{name}.mlir"
        src.write_text(text)
        return lower_with_tool(self.tool, src, work / "out", timeout=self.timeout)


def _first_error(log: Path) -> str:
    lines = log.read_text(errors="replace").splitlines() if log.is_file() else []
    for ln in lines:
        if "error" in ln.lower() and not ln.startswith("$ "):
            return ln.strip()
    tail = [ln.strip() for ln in lines if ln.strip() and not ln.startswith("$ ")]
    return tail[-1] if tail else "(no output)"


@dataclass
class AirccLowerer:
    tc: Toolchain

    def describe(self) -> str:
        return f"installed aircc {self.tc.aircc} + aiecc {self.tc.aiecc} + Peano {self.tc.peano}"

    def identity(self) -> str:
        return self.describe()

    def lower(self, name: str, text: str, work: Path) -> Lowered:
        from kernel_builder.presets import preset_of_text
        from .build_report import BuildError
        from .keys import externals_for_text
        from .npu import aircc_command, compile_externals, run_aircc

        t0 = time.perf_counter()
        log = work / "lower.log"
        try:
            compile_externals(name, externals_for_text(text), work, self.tc, log)
        except BuildError as e:
            return Lowered(False, "externals", str(e), time.perf_counter() - t0)
        src = work / "air.mlir"
        src.write_text(text)
        insts = work / f"{name}.insts.bin"
        cmd = aircc_command(self.tc, src, work, ["--output-format", "none", "-i", str(insts)],
                            preset_of_text(text).flags())
        rc = run_aircc(cmd, self.tc, work, log)
        dt = time.perf_counter() - t0
        if rc != 0:
            return Lowered(False, "aircc", f"exit {rc}: {_first_error(log)}", dt)
        if not insts.is_file():
            return Lowered(False, "aircc", f"exit 0 but no {insts.name} written", dt)
        return Lowered(True, message=f"OK {insts.stat().st_size} bytes of NPU instructions", seconds=dt)


def find_lowerer(env: dict | None = None, tc: Toolchain | None = None, tool: str | None = None):
    """An explicit tool, else the installed aircc + aiecc + Peano, else $LLAMA_NPU_AIR_LOWER; else
    LoweringUnavailable naming what is missing."""
    env = os.environ if env is None else env
    if tool:
        return ToolLowerer(_checked_tool(tool, "--tool"))
    tc = tc or detect(env)
    if tc.aircc and tc.aiecc and tc.peano:
        return AirccLowerer(tc)
    named = env.get(LOWER_ENV, "").strip()
    if named:
        return ToolLowerer(_checked_tool(named, f"${LOWER_ENV}"))
    missing = ", ".join(p for p, have in (("aircc", tc.aircc), ("aiecc", tc.aiecc), ("Peano", tc.peano)) if not have)
    raise LoweringUnavailable(
        f"no lowering toolchain: {missing} not installed and ${LOWER_ENV} not set; install the pinned mlir-air/"
        f"mlir-aie (docs/npu-setup.md#mlir-air) or build a lowering tool and point ${LOWER_ENV} at it ({LOWER_DOC})")


def _checked_tool(path: str, source: str) -> str:
    p = Path(path).expanduser()
    if not p.is_file() or not os.access(p, os.X_OK):
        raise LoweringUnavailable(f"{source} names {path}, which is not an executable file ({LOWER_DOC})")
    return str(p)


@dataclass
class LowerRow:
    name: str
    launches: int
    result: Lowered
    memo: bool = False     # the verdict of an earlier run on the same text with the same lowerer


@dataclass
class LoweringReport:
    lowerer: str
    rows: list[LowerRow] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return bool(self.rows) and all(r.result.ok for r in self.rows)

    def table(self) -> str:
        w = max([len("module")] + [len(r.name) for r in self.rows])
        sw = max([len("stage")] + [len(r.result.stage) for r in self.rows])
        head = f"{'module':<{w}}  {'launches':>8}  {'result':<6}  {'stage':<{sw}}  {'seconds':>8}"
        lines = [head, "-" * len(head)]
        for r in self.rows:
            res = r.result
            lines.append(f"{r.name:<{w}}  {r.launches:>8}  {'OK' if res.ok else 'FAIL':<6}  "
                         f"{res.stage or '-':<{sw}}  {res.seconds:8.1f}" + ("  memo" if r.memo else ""))
        bad = [r for r in self.rows if not r.result.ok]
        total = sum(r.result.seconds for r in self.rows)
        memo = sum(r.memo for r in self.rows)
        lines.append(f"{len(self.rows) - len(bad)}/{len(self.rows)} modules lower ({total:.0f} s of lowering"
                     + (f", {memo} verdicts from earlier runs on the same text" if memo else "")
                     + f"; {self.lowerer})")
        lines += [f"FAILED {r.name}: {r.result.stage}: {r.result.message}" for r in bad]
        return "\n".join(lines)

    __str__ = table


# verdicts that say something about the module (not about the run: a timeout, a tool that did not start, a crash)
_UNKEPT_STAGES = {"timeout", "tool", "check", "?"}


@dataclass
class VerdictMemo:
    """Verdicts kept as JSON files named by sha256(lowerer identity, module text)."""
    root: Path

    def _path(self, lowerer, text: str) -> Path:
        h = hashlib.sha256(lowerer.identity().encode() + b"\0" + text.encode()).hexdigest()
        return self.root / f"{h}.json"

    def get(self, lowerer, text: str) -> Lowered | None:
        try:
            d = json.loads(self._path(lowerer, text).read_text())
            return Lowered(bool(d["ok"]), str(d["stage"]), str(d["message"]), float(d["seconds"]))
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def put(self, lowerer, text: str, res: Lowered) -> None:
        if not res.ok and res.stage in _UNKEPT_STAGES:
            return
        p = self._path(lowerer, text)
        try:
            p.parent.mkdir(parents=True, exist_ok=True)
            tmp = p.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps({"ok": res.ok, "stage": res.stage, "message": res.message,
                                       "seconds": res.seconds}))
            os.replace(tmp, p)
        except OSError:
            pass  # a memo that cannot be written only costs a re-lowering next time


def check_lowering(modules: list[tuple[str, str, int]], lowerer, progress: bool = True,
                   work_root: Path | None = None, memo: VerdictMemo | None = None) -> LoweringReport:
    """Lower each (name, stitched text, launch count) with `lowerer` in its own temporary directory; with a
    `memo`, a module whose text this lowerer has judged before is not lowered again (its row says `memo`)."""
    report = LoweringReport(lowerer.describe())
    bar = None
    if progress:
        try:
            from tqdm import tqdm
            bar = tqdm(total=len(modules), desc="check-lowering", unit="module", file=sys.stderr, leave=False)
        except ImportError:  # pragma: no cover
            bar = None
    try:
        for name, text, launches in modules:
            if bar is not None:
                bar.set_postfix_str(name)
            res = memo.get(lowerer, text) if memo is not None else None
            cached = res is not None
            if res is None:
                res = _lower_one(lowerer, name, text, work_root)
                if memo is not None:
                    memo.put(lowerer, text, res)
            report.rows.append(LowerRow(name, launches, res, cached))
            if bar is not None:
                bar.update(1)
    finally:
        if bar is not None:
            bar.close()
    return report


def _lower_one(lowerer, name: str, text: str, work_root: Path | None) -> Lowered:
    with tempfile.TemporaryDirectory(prefix=f"lower-{name}-", dir=work_root) as tmp:
        try:
            return lowerer.lower(name, text, Path(tmp))
        except Exception as e:  # one module's crash is that module's row, not the end of the check
            return Lowered(False, "check", f"{type(e).__name__}: {e}")
