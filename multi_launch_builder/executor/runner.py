"""ModuleExecutor: one loaded binary per module, one buffer set per bo_key; the transfer contract is in
multi_launch_builder/executor/__init__.py and docs/cache.md. Device buffers live in `buffers`, STATE
buffers in `state`, argument checks and ref resolution in `binding`; this class runs calls and counts bytes."""
from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping

import numpy as np

from ..decl import ModuleDecl, Role
from ..devices.base import Artifact, Buffer, Device
from .binding import (DeviceRef, bind_args, check_alias_hazard, check_value, host_shape, numpy_dtype,
                      resolve_ref)
from multi_launch_builder.executor.buffers import DeviceMemory
from .state import StateStore

HANDOFFS = ("device", "host")


@dataclass
class ModuleCounters:
    calls: int = 0
    bytes_written: int = 0        # every host->device byte (inputs, statics, scalars, host hand-offs)
    static_bytes_written: int = 0 # the part of bytes_written that was statics
    bytes_read: int = 0
    write_s: float = 0.0
    run_s: float = 0.0
    read_s: float = 0.0


class ModuleExecutor:
    def __init__(self, device: Device, artifacts: Mapping[str, Artifact] | str | Path,
                 decls: Mapping[str, ModuleDecl] | Iterable[ModuleDecl], handoff: str = "device"):
        if not isinstance(decls, Mapping):
            decls = {d.name: d for d in decls}
        if handoff not in HANDOFFS:
            raise ValueError(f"handoff must be one of {HANDOFFS}, got {handoff!r}")
        self.device = device
        self.handoff = handoff
        self.decls: dict[str, ModuleDecl] = dict(decls)
        if isinstance(artifacts, (str, Path)):
            from multi_launch_builder.compile import load_artifacts
            artifacts = load_artifacts(Path(artifacts), getattr(device, "name", "emu"), list(self.decls.values()))
        self.artifacts: dict[str, Artifact] = dict(artifacts)
        self._handles: OrderedDict[str, object] = OrderedDict()   # loaded modules, least recently used first
        self._mem = DeviceMemory(device)
        self._states = StateStore(self.decls.values(), self._mem, self._counters)
        self._resident: set[tuple[str, str]] = set()             # (module, bo_key) whose statics are all written
        self._safe_alias_patterns: set[tuple] = set()
        self.counters: dict[str, ModuleCounters] = {}
        self._plans: dict[str, tuple] = {}
        self._programs: dict[str, object] = {}      # module -> LaunchProgram (alias hazard checks)

    @property
    def allocated_bytes(self) -> int:
        return self._mem.allocated_bytes

    # ---------------------------------------------------------------- internals
    def _decl(self, name: str) -> ModuleDecl:
        try:
            return self.decls[name]
        except KeyError:
            raise ValueError(f"unknown module {name!r}; declared: {sorted(self.decls)}") from None

    def _plan(self, decl: ModuleDecl):
        """Per-module precomputed (arg, host dtype, role) rows and name -> index map."""
        p = self._plans.get(decl.name)
        if p is None:
            rows = tuple((a, numpy_dtype(a), a.role) for a in decl.args)
            p = (rows, {a.name: i for i, a in enumerate(decl.args)})
            self._plans[decl.name] = p
        return p

    def _handle(self, name: str):
        """The loaded module; at the device's limit of loaded modules (hardware contexts), the least recently
        used one is unloaded first (it reloads on its next call; buffers are unaffected)."""
        h = self._handles.get(name)
        if h is not None:
            self._handles.move_to_end(name)
            return h
        if name not in self.artifacts:
            raise ValueError(f"module {name}: no compiled artifact (run `llama-npu compile`)")
        limit = getattr(self.device, "max_loaded", None)
        while limit and len(self._handles) >= limit:
            _, old = self._handles.popitem(last=False)
            self.device.unload(old)
        h = self._handles[name] = self.device.load(self.artifacts[name])
        return h

    def _counters(self, name: str) -> ModuleCounters:
        c = self.counters.get(name)
        if c is None:
            c = self.counters[name] = ModuleCounters()
        return c

    def _resolve_ref(self, decl: ModuleDecl, arg, ref: DeviceRef) -> Buffer:
        rows, index = self._plan(self._decl(ref.module))
        return resolve_ref(decl, arg, ref, rows, index, self._mem.bound, self._mem.view)

    def _program(self, name: str):
        p = self._programs.get(name)
        if p is None:
            from multi_launch_builder.emulator.launch_program import read_launch_program
            p = self._programs[name] = read_launch_program(Path(self.artifacts[name].mlir).read_text())
        return p

    # ---------------------------------------------------------------- public API
    def ref(self, module: str, arg: str, row: int | None = None) -> DeviceRef:
        """A device-side value for an INPUT of another call: `module.arg`'s buffer as of its last call
        (from leading-dimension `row` on, when given: e.g. the last real row of a prefill output)."""
        decl = self._decl(module)
        if arg not in self._plan(decl)[1]:
            raise ValueError(f"module {module}: unknown argument {arg!r}; declared: {[a.name for a in decl.args]}")
        if row is not None and (isinstance(row, bool) or not isinstance(row, int) or row < 0):
            raise ValueError(f"ref {module}.{arg}: row must be an int >= 0, got {row!r}")
        return DeviceRef(module, arg, row)

    def define_state(self, name: str, rows: int, per_key: bool = True) -> None:
        """Give state `name` a capacity of `rows` rows (per bo_key, or one buffer when per_key=False).
        Growing or shrinking an existing state re-allocates its buffers and keeps the rows that fit (a
        device-side copy); windows and refs into the old buffers are dropped."""
        self._states.define(name, rows, per_key)

    def read_state(self, name: str, bo_key: str, start: int = 0, stop: int | None = None) -> np.ndarray:
        """Host copy of rows [start, stop) of a state buffer (counted under `state:<name>`)."""
        return self._states.read(name, bo_key, start, stop)

    def write_state(self, name: str, data: np.ndarray, bo_key: str | None = None, start: int = 0) -> None:
        """Host rows into a state buffer at row `start` (e.g. the RoPE table once, as it grows); counted
        under `state:<name>`."""
        self._states.write(name, data, bo_key, start)

    def write_static(self, name: str, bo_key: str | None = None, **statics) -> None:
        """Write static arguments (weights, tables) of one bo_key ahead of time. A value is an array of the
        argument's host shape/dtype, or a callable `fill(view)` that writes the bytes straight into the
        device buffer's host mapping (a uint8 array of the argument's size): the weight loader reads each
        tensor from its file into that view, so no second host copy exists."""
        decl = self._decl(name)
        rows, index = self._plan(decl)
        bo_key = name if bo_key is None else bo_key
        bset = self._mem.buffer_set(decl, bo_key)
        c = self._counters(name)
        for k, v in statics.items():
            i = index.get(k)
            if i is None:
                raise ValueError(f"module {name}: unknown argument {k!r}")
            arg, dt, role = rows[i]
            if role is not Role.STATIC:
                raise ValueError(f"module {name} arg {k}: role is {role.value}, write_static takes static args only")
            if not callable(v):
                check_value(decl, arg, dt, v)
            st = bset.statics[k]
            if st.written:  # already resident (this bo_key, or a sibling module of the family)
                continue
            t0 = time.perf_counter()
            if callable(v):
                self.device.fill(st.buf, v)
            else:
                self.device.write(st.buf, v)
            c.write_s += time.perf_counter() - t0
            c.bytes_written += arg.nbytes
            c.static_bytes_written += arg.nbytes
            st.written = True

    preload = write_static

    def load_and_run(self, name: str, *args, bo_key: str | None = None, read: Iterable[str] | None = None,
                     **named) -> dict[str, np.ndarray]:
        """Run one module. INPUTs are host arrays or `ref(...)`s; scalars are passed by name as ints;
        `read` names the outputs to read back (default all; the rest stay on the device)."""
        decl = self._decl(name)
        rows, index = self._plan(decl)
        values, scalars = bind_args(decl, rows, index, args, named)
        if read is not None:
            read = set(read)
            bad = sorted(r for r in read if r not in index or rows[index[r]][2] is not Role.OUTPUT)
            if bad:
                raise ValueError(f"module {name}: read= names {bad}, which are not outputs; "
                                 f"outputs: {list(decl.names(Role.OUTPUT))}")
        bo_key = name if bo_key is None else bo_key
        refs = self._checked_refs(name, decl, rows, values, bo_key)   # a bad call transfers nothing
        windows = {i: self._states.window(decl, arg, bo_key, scalars)
                   for i, (arg, _, role) in enumerate(rows) if role is Role.STATE}
        handle = self._handle(name)
        bset = self._mem.buffer_set(decl, bo_key)
        if all(st.written for st in bset.statics.values()):
            self._resident.add((name, bo_key))      # later calls skip the per-static residency checks
        bufs = list(bset.buffers)
        for i, b in windows.items():
            bufs[i] = b
        host_copies = {}
        if refs and self.handoff == "device":
            for i, b in refs.items():
                bufs[i] = b
        elif refs:
            host_copies = refs
        if refs and self.handoff == "device":
            check_alias_hazard(decl, bufs, refs, lambda: self._program(name), self._safe_alias_patterns)
        c = self._counters(name)
        dev = self.device

        t0 = time.perf_counter()
        for i, ((arg, dt, role), v) in enumerate(zip(rows, values)):
            if i in host_copies:   # handoff="host": the producer's bytes travel through the host
                data = dev.read(host_copies[i], (host_copies[i].nbytes,), np.uint8)
                dev.write(bufs[i], data)
                c.bytes_read += arg.nbytes
                c.bytes_written += arg.nbytes
            elif i in refs:
                continue  # already on the device
            elif role is Role.INPUT:
                dev.write(bufs[i], v)
                c.bytes_written += arg.nbytes
            elif role is Role.SCALAR:
                c.bytes_written += self._mem.write_scalar(bufs[i], scalars[arg.name])
            elif role is Role.STATIC and v is not None and not bset.statics[arg.name].written:
                dev.write(bufs[i], v)
                c.bytes_written += arg.nbytes
                c.static_bytes_written += arg.nbytes
                bset.statics[arg.name].written = True
        t1 = time.perf_counter()
        dev.run(handle, bufs)
        self._mem.bound[name] = bufs
        t2 = time.perf_counter()
        out: dict[str, np.ndarray] = {}
        for i, (arg, dt, role) in enumerate(rows):
            if role is Role.OUTPUT and (read is None or arg.name in read):
                out[arg.name] = dev.read(bufs[i], host_shape(arg), dt)
                c.bytes_read += arg.nbytes
        t3 = time.perf_counter()
        c.calls += 1
        c.write_s += t1 - t0
        c.run_s += t2 - t1
        c.read_s += t3 - t2
        return out

    def _checked_refs(self, name: str, decl, rows, values, bo_key: str) -> dict[int, Buffer]:
        """Every argument of a call checked before the device is touched (one ValueError naming the module and
        argument); the inputs bound to another module's buffer, by argument index."""
        refs: dict[int, Buffer] = {}
        for i, ((arg, dt, role), v) in enumerate(zip(rows, values)):
            if role is Role.INPUT:
                if v is None:
                    raise ValueError(f"module {name} arg {arg.name}: input missing (inputs are written every call)")
                if isinstance(v, DeviceRef):
                    refs[i] = self._resolve_ref(decl, arg, v)
                else:
                    check_value(decl, arg, dt, v)
            elif isinstance(v, DeviceRef):
                raise ValueError(f"module {name} arg {arg.name}: role {role.value} cannot take a ref "
                                 f"(only inputs can be bound to another module's buffer)")
            elif role is Role.STATIC:
                if v is None:
                    if (name, bo_key) not in self._resident and not self._mem.static_resident(decl, bo_key, arg):
                        raise ValueError(f"module {name} arg {arg.name}: static missing on the first call "
                                         f"of bo_key {bo_key!r}")
                else:
                    check_value(decl, arg, dt, v)
            elif v is not None:
                raise ValueError(f"module {name} arg {arg.name}: role {role.value} is never written by the "
                                 f"host; pass None" + (" (scalars go by name)" if role is Role.SCALAR else ""))
        return refs

    def free(self, name: str, bo_key: str | None = None) -> None:
        """Release one module's buffer set (the next call of that bo_key starts fresh)."""
        bo_key = name if bo_key is None else bo_key
        self._resident.discard((name, bo_key))
        if (name, bo_key) in self._mem.sets:
            self._mem.free_set(self._decl(name), bo_key)

    def bo_keys(self, name: str) -> list[str]:
        return self._mem.bo_keys(name)

    def reset_counters(self) -> None:
        self.counters.clear()

    def report(self) -> list[dict]:
        """One row per module for the profile table."""
        rows = []
        for name, c in sorted(self.counters.items()):
            rows.append({
                "module": name, "calls": c.calls,
                "bytes_written": c.bytes_written, "static_bytes_written": c.static_bytes_written,
                "bytes_read": c.bytes_read,
                "write_s": c.write_s, "run_s": c.run_s, "read_s": c.read_s,
                "run_ms_per_call": 1e3 * c.run_s / c.calls if c.calls else 0.0,
                "bo_keys": len(self.bo_keys(name)),
            })
        return rows

    def memory_report(self) -> dict:
        """Bytes held by this cache's buffers (of which states), and the device's own live/peak totals."""
        stats = getattr(self.device, "stats", None)
        return {"cache_allocated_bytes": self.allocated_bytes,
                "state_bytes": self._states.nbytes(),
                "device_allocated_bytes": getattr(stats, "allocated_bytes", None),
                "device_peak_allocated_bytes": getattr(stats, "peak_allocated_bytes", None)}
