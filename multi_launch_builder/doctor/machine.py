"""The machine `llama-npu doctor` looks at: a root directory for /sys, /dev, /proc, /lib/firmware and
/etc, a command runner with a timeout on every command, who we are (uid, groups) and how the NPU
toolchain is found. Tests build a fake machine (a tmp tree + canned command outputs); the real one
is `Machine.local()`. Nothing here needs root.
"""
from __future__ import annotations

import importlib.metadata
import os
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

DEFAULT_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class CmdResult:
    argv: tuple[str, ...]
    returncode: int | None
    stdout: str = ""
    stderr: str = ""
    failure: str | None = None      # exception name when the command did not run to completion
    timed_out: bool = False
    timeout_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.failure is None and self.returncode == 0

    @property
    def text(self) -> str:
        return self.stdout if self.stdout.strip() else self.stderr

    def why(self) -> str:
        """One phrase for a failed run, e.g. 'did not answer within 10 s' or 'exit 1: <last line>'."""
        if self.timed_out:
            return f"did not answer within {self.timeout_s:g} s"
        if self.failure == "FileNotFoundError":
            return "not found"
        if self.failure:
            return f"could not run ({self.failure})"
        last = [ln.strip() for ln in (self.stderr or self.stdout).splitlines() if ln.strip()]
        return f"exit {self.returncode}" + (f": {last[-1]}" if last else "")


def run_command(argv: Sequence[str], timeout: float, env: dict | None = None) -> CmdResult:
    """Run argv with stdin closed and a timeout. The command gets its own session, so on timeout
    its whole process group (children included) is killed and the pipes close."""
    argv = tuple(str(a) for a in argv)
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, errors="replace", env=env,
                                start_new_session=True)
    except OSError as e:
        return CmdResult(argv, None, failure=type(e).__name__)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            proc.communicate(timeout=2)
        except subprocess.TimeoutExpired:  # a grandchild outside the group still holds a pipe
            pass
        return CmdResult(argv, None, failure="TimeoutExpired", timed_out=True, timeout_s=timeout)
    return CmdResult(argv, proc.returncode, out, err)


@dataclass(frozen=True)
class DistInfo:
    """What an installed wheel's metadata says: its version and Requires-Dist lines."""
    name: str
    version: str
    requires: tuple[str, ...] = ()


def installed_dist(name: str) -> DistInfo | None:
    try:
        d = importlib.metadata.distribution(name)
    except importlib.metadata.PackageNotFoundError:
        return None
    return DistInfo(name, d.version, tuple(d.requires or ()))


def _local_toolchain(env: dict):
    from kernel_builder.toolchain import detect

    return detect(env)


@dataclass
class Machine:
    root: Path = Path("/")
    env: dict = field(default_factory=lambda: dict(os.environ))
    uid: int = field(default_factory=os.getuid)
    gids: frozenset = field(default_factory=lambda: frozenset(os.getgroups()) | {os.getegid()})
    user: str = ""
    python: str = sys.executable
    timeout_s: float = DEFAULT_TIMEOUT_S
    # (argv, timeout) -> CmdResult; default: run_command with this machine's env
    runner: Callable[[Sequence[str], float], CmdResult] | None = None
    # () -> kernel_builder.toolchain.Toolchain; default: toolchain.detect(env)
    toolchain: Callable[[], object] | None = None
    # name -> DistInfo | None; default: importlib.metadata of this interpreter
    dist: Callable[[str], DistInfo | None] = installed_dist
    # the real machine may also trust os.access (ACLs such as systemd's uaccess); a fake tree may not
    use_os_access: bool = False

    @classmethod
    def local(cls, timeout_s: float = DEFAULT_TIMEOUT_S) -> "Machine":
        import pwd

        try:
            user = pwd.getpwuid(os.getuid()).pw_name
        except KeyError:
            user = str(os.getuid())
        return cls(user=user, timeout_s=timeout_s, use_os_access=True)

    def __post_init__(self) -> None:
        self.root = Path(self.root)
        if not self.user:
            self.user = self.env.get("USER") or str(self.uid)
        self._tc = None
        self._runs: dict[tuple, CmdResult] = {}

    # ------------------------------------------------------------------ files under root
    def path(self, p: str) -> Path:
        return self.root / p.lstrip("/")

    def read(self, p: str) -> str | None:
        try:
            return self.path(p).read_text(errors="replace")
        except OSError:
            return None

    def glob(self, pattern: str) -> list[Path]:
        return sorted(self.root.glob(pattern.lstrip("/")))

    def shown(self, path: Path) -> str:
        """A path under root as the user would type it (/dev/accel/accel0, not <tmp>/dev/...)."""
        try:
            return "/" + str(Path(path).relative_to(self.root)).lstrip("/")
        except ValueError:
            return str(path)

    # ------------------------------------------------------------------ commands and tools
    def run(self, argv: Sequence[str], timeout: float | None = None) -> CmdResult:
        """Run a probe command (each distinct argv once per Machine: probes only ask, never change)."""
        key = tuple(str(a) for a in argv)
        if key not in self._runs:
            t = self.timeout_s if timeout is None else timeout
            self._runs[key] = (self.runner(list(key), t) if self.runner is not None
                               else run_command(key, t, env=self.env))
        return self._runs[key]

    def which(self, name: str) -> str | None:
        return shutil.which(name, path=self.env.get("PATH", os.defpath))

    def tools(self):
        """The detected toolchain (aircc/aiecc/Peano paths), looked up once."""
        if self._tc is None:
            self._tc = self.toolchain() if self.toolchain is not None else _local_toolchain(self.env)
        return self._tc

    def dist_first(self, *names: str) -> DistInfo | None:
        for n in names:
            d = self.dist(n)
            if d is not None:
                return d
        return None

    # ------------------------------------------------------------------ users and groups
    def _group_file(self) -> list[list[str]]:
        text = self.read("/etc/group") or ""
        return [ln.split(":") for ln in text.splitlines() if ln.count(":") >= 3]

    def group_name(self, gid: int) -> str:
        for parts in self._group_file():
            if parts[2] == str(gid):
                return parts[0]
        if self.root == Path("/"):
            import grp

            try:
                return grp.getgrgid(gid).gr_name
            except KeyError:
                pass
        return str(gid)

    def user_name(self, uid: int) -> str:
        if uid == self.uid:
            return self.user
        for ln in (self.read("/etc/passwd") or "").splitlines():
            parts = ln.split(":")
            if len(parts) > 2 and parts[2] == str(uid):
                return parts[0]
        return str(uid)

    def listed_in_group(self, gid: int) -> bool:
        """Whether /etc/group lists this user as a member of gid (a later login would get it)."""
        for parts in self._group_file():
            if parts[2] == str(gid):
                return self.user in [m.strip() for m in parts[3].split(",") if m.strip()]
        return False
