"""Locked-memory limit and free host memory against what the chosen model needs.

The model layer computes the need (llama_npu.memory.plan_memory) and passes it in as a MemoryNeed;
nothing here knows what a model is.
"""
from __future__ import annotations

import math
import re
import resource
from dataclasses import dataclass, field
from pathlib import Path

from .machine import Machine
from multi_launch_builder.doctor.check_report import FAIL, OK, SKIP, Check, fmt_bytes
from .system import Facts

GIB = 1 << 30


@dataclass(frozen=True)
class MemoryNeed:
    label: str                 # e.g. "smollm2 (30 layers), buckets 64,256, context 8192"
    total_bytes: int           # device buffers + KV cache the run keeps
    parts: dict = field(default_factory=dict)   # name -> bytes, shown in --json
    reduce_hint: str = "run with less: fewer or smaller buffers"   # how the caller's user can need less


def read_memlock(m: Machine) -> tuple[int | None, int | None] | None:
    """(soft, hard) locked-memory limit in bytes (None = unlimited) from /proc/self/limits, as the
    kernel enforces it for this process; None when it cannot be read."""
    text = m.read("/proc/self/limits")
    if text is not None:
        for ln in text.splitlines():
            if ln.startswith("Max locked memory"):
                vals = ln[len("Max locked memory"):].split()
                if len(vals) >= 2:
                    conv = [None if v == "unlimited" else int(v) if v.isdigit() else -1 for v in vals[:2]]
                    if -1 not in conv:
                        return conv[0], conv[1]
        return None
    if m.root != Path("/"):
        return None
    soft, hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    inf = resource.RLIM_INFINITY
    return (None if soft == inf else soft), (None if hard == inf else hard)


CAP_IPC_LOCK = 14   # linux/capability.h


def has_ipc_lock(m: Machine) -> bool:
    """CAP_IPC_LOCK in this process's effective set (/proc/self/status CapEff): the driver does not
    count pinned buffers against RLIMIT_MEMLOCK for such a process (amdxdna_ubuf.c)."""
    for ln in (m.read("/proc/self/status") or "").splitlines():
        if ln.startswith("CapEff:"):
            try:
                return bool(int(ln.split()[1], 16) >> CAP_IPC_LOCK & 1)
            except (IndexError, ValueError):
                return False
    return False


def limits_conf_kib(need_bytes: int) -> int:
    """The memlock value (KiB, as limits.conf counts) for a need: rounded up to a whole GiB."""
    return max(1, math.ceil(need_bytes / GIB)) * (GIB // 1024)


def check_memlock(m: Machine, f: Facts, need: MemoryNeed | None) -> Check:
    lim = read_memlock(m)
    if lim is None:
        return Check("memlock", "memlock limit", SKIP, "could not read the locked-memory limit")
    soft, hard = lim
    shown = "unlimited" if soft is None else fmt_bytes(soft)
    data = {"soft_bytes": soft, "hard_bytes": hard, "need_bytes": need.total_bytes if need else None}
    if soft is None:
        return Check("memlock", "memlock limit", OK, "unlimited", data=data)
    if need is None:
        return Check("memlock", "memlock limit", SKIP, f"{shown} (no model to size it against)", data=data)
    if soft >= need.total_bytes:
        return Check("memlock", "memlock limit", OK,
                     f"{shown} >= {fmt_bytes(need.total_bytes)} the model needs", data=data)
    if has_ipc_lock(m):
        return Check("memlock", "memlock limit", OK,
                     f"{shown} < {fmt_bytes(need.total_bytes)}, but this process has CAP_IPC_LOCK (e.g. root), "
                     f"which the limit does not apply to; a normal user needs it raised", data=data)
    kib = limits_conf_kib(need.total_bytes)
    line = f"{m.user}  -  memlock  {kib}"
    data["limits_conf"] = line
    if hard is None or hard >= need.total_bytes:
        now = f"`ulimit -l {kib}` raises it for this shell (the hard limit allows it); to keep it, "
    else:
        now = ""
    return Check("memlock", "memlock limit", FAIL,
                 f"{shown} < {fmt_bytes(need.total_bytes)} the model's buffers need (buffer allocation "
                 f"would fail)",
                 fix=f"{now}add `{line}` (or `unlimited`) to /etc/security/limits.conf, log out and back in, "
                     f"and check `ulimit -l`",
                 anchor="memory-limits", data=data)


def read_meminfo(m: Machine) -> dict[str, int]:
    out = {}
    for ln in (m.read("/proc/meminfo") or "").splitlines():
        mm = re.match(r"(\w+):\s+(\d+)\s*kB", ln)
        if mm:
            out[mm[1]] = int(mm[2]) * 1024
    return out


def _xrt_memory_line(f: Facts) -> str | None:
    res = f.examine
    text = getattr(res, "stdout", "") or ""
    mm = re.search(r"^\s*Memory\s*:\s*(\d+)\s*MB", text, re.M)
    return f"XRT reports {mm[1]} MB of system memory" if mm else None


def check_host_memory(m: Machine, f: Facts, need: MemoryNeed | None) -> Check:
    info = read_meminfo(m)
    avail, total = info.get("MemAvailable"), info.get("MemTotal")
    if avail is None:
        return Check("host-memory", "host memory", SKIP, "no MemAvailable in /proc/meminfo")
    notes = [x for x in (_xrt_memory_line(f),) if x]
    if f.driver in ("module", "built-in", "loaded"):
        notes.append("amdxdna publishes no addressable-memory limit (it maps buffers through the IOMMU)")
    tail = f"; {'; '.join(notes)}" if notes else ""
    data = {"available_bytes": avail, "total_bytes": total, "need_bytes": need.total_bytes if need else None,
            "notes": notes}
    have = f"{fmt_bytes(avail)} available of {fmt_bytes(total)}"
    if need is None:
        return Check("host-memory", "host memory", SKIP, f"{have} (no model to size it against){tail}", data=data)
    if avail >= need.total_bytes:
        return Check("host-memory", "host memory", OK,
                     f"{have} >= {fmt_bytes(need.total_bytes)} for {need.label}{tail}", data=data)
    return Check("host-memory", "host memory", FAIL,
                 f"{have} < {fmt_bytes(need.total_bytes)} for {need.label}{tail}",
                 fix=f"free memory (close other programs) or {need.reduce_hint}",
                 anchor="memory-limits", data=data)
