"""KernelCache: compile-once artifacts, one loaded binary per module, one buffer set per bo_key.

Transfer contract (roles come from the ModuleDecl, never re-typed):
- input        : written by the host on every call;
- static       : written on the first call of a bo_key (or by preload/write_static), then kept;
- intermediate : device-only, never transferred (zero on allocation);
- output       : never written by the host; read back after every call.
Counters are exact: bytes_written / bytes_read are the nbytes actually transferred.

Buffer sharing (device memory): a static buffer belongs to (module family, bo_key, arg name, shape,
dtype), so the prefill modules of every bucket share one copy of a layer's weights; input,
intermediate and output buffers belong to the module alone and are shared by all its bo_keys, because
calls run one at a time and outputs are consumed (read back or passed on by a ref) before the module
runs again. A bo_key's buffer set is a
view onto these pools.

Device-side hand-off (cross-module aliasing): an INPUT may be given as `cache.ref(module, arg)` instead of
a host array; that call binds the slot to the buffer the referenced argument used in its module's last
call (no host write, 0 bytes), so an intermediate flows from one dispatch to the next without a host
round trip. `read=` names the outputs to read back (default: all); the others stay on the device.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Mapping

import numpy as np

from multi_launch_builder.decl import Arg, ModuleDecl, Role

from .devices.base import Artifact, Buffer, Device
from .numerics import BF16

_DTYPES = {"bf16": BF16, "f32": np.dtype(np.float32), "i32": np.dtype(np.int32),
           "i8": np.dtype(np.int8), "u8": np.dtype(np.uint8)}


def numpy_dtype(arg: Arg) -> np.dtype:
    try:
        return _DTYPES[arg.dtype]
    except KeyError:
        raise ValueError(f"argument {arg.name}: unsupported dtype {arg.dtype!r}") from None


@dataclass
class ModuleCounters:
    calls: int = 0
    bytes_written: int = 0        # every host->device byte (inputs + statics)
    static_bytes_written: int = 0 # the part of bytes_written that was statics
    bytes_read: int = 0
    write_s: float = 0.0
    run_s: float = 0.0
    read_s: float = 0.0


@dataclass(frozen=True)
class DeviceRef:
    """An INPUT value meaning "the device buffer `module.arg` used in that module's last call"
    (made by KernelCache.ref). Its contents are whatever the device holds there when the call runs."""

    module: str
    arg: str


@dataclass
class _Static:
    buf: Buffer
    written: bool = False
    users: int = 0


@dataclass
class _BufferSet:
    buffers: list[Buffer]
    statics: dict[str, _Static] = field(default_factory=dict)   # static arg name -> shared slot

    @property
    def statics_written(self) -> set[str]:
        return {n for n, st in self.statics.items() if st.written}


def _static_key(decl: ModuleDecl, bo_key: str, a: Arg) -> tuple:
    """A static buffer's identity: shared by the modules of one family under one bo_key."""
    return (decl.static_group, bo_key, a.name, a.shape, a.dtype)


class KernelCache:
    def __init__(self, device: Device, artifacts: Mapping[str, Artifact] | str | Path,
                 decls: Mapping[str, ModuleDecl] | Iterable[ModuleDecl]):
        if not isinstance(decls, Mapping):
            decls = {d.name: d for d in decls}
        self.device = device
        self.decls: dict[str, ModuleDecl] = dict(decls)
        if isinstance(artifacts, (str, Path)):
            from .build import load_artifacts
            artifacts = load_artifacts(Path(artifacts), getattr(device, "name", "emu"), list(self.decls.values()))
        self.artifacts: dict[str, Artifact] = dict(artifacts)
        self._handles: dict[str, object] = {}
        self._sets: dict[tuple[str, str], _BufferSet] = {}
        self._static_pool: dict[tuple, _Static] = {}            # (group, bo_key, arg, shape, dtype)
        self._act_pool: dict[tuple[str, str], list] = {}        # (module, arg) -> [buffer, users]
        self._safe_alias_patterns: set[tuple] = set()            # (module, slot groups) checked once
        self.counters: dict[str, ModuleCounters] = {}
        self.allocated_bytes = 0
        self._plans: dict[str, tuple] = {}
        self._bound: dict[str, list[Buffer]] = {}   # module -> the buffer list of its last call (refs)
        self._programs: dict[str, object] = {}      # module -> LaunchProgram (alias hazard checks)

    # ---------------------------------------------------------------- internals
    def _decl(self, name: str) -> ModuleDecl:
        try:
            return self.decls[name]
        except KeyError:
            raise ValueError(f"unknown module {name!r}; declared: {sorted(self.decls)}") from None

    def _plan(self, decl: ModuleDecl):
        """Per-module precomputed (arg, numpy dtype, role) rows and name -> index map."""
        p = self._plans.get(decl.name)
        if p is None:
            rows = tuple((a, numpy_dtype(a), a.role) for a in decl.args)
            p = (rows, {a.name: i for i, a in enumerate(decl.args)})
            self._plans[decl.name] = p
        return p

    def _handle(self, name: str):
        h = self._handles.get(name)
        if h is None:
            if name not in self.artifacts:
                raise ValueError(f"module {name}: no compiled artifact (run `llama-npu compile`)")
            h = self.device.load(self.artifacts[name])
            self._handles[name] = h
        return h

    def _buffer_set(self, decl: ModuleDecl, bo_key: str) -> tuple[_BufferSet, bool]:
        key = (decl.name, bo_key)
        s = self._sets.get(key)
        if s is not None:
            return s, False
        bufs, statics = [], {}
        for a in decl.args:
            if a.role is Role.STATIC:
                pkey = _static_key(decl, bo_key, a)
                st = self._static_pool.get(pkey)
                if st is None:
                    st = self._static_pool[pkey] = _Static(self._alloc(a.nbytes))
                st.users += 1
                statics[a.name] = st
                bufs.append(st.buf)
            else:
                slot = self._act_pool.get((decl.name, a.name))
                if slot is None:
                    slot = self._act_pool[(decl.name, a.name)] = [self._alloc(a.nbytes), 0]
                slot[1] += 1
                bufs.append(slot[0])
        s = _BufferSet(bufs, statics)
        self._sets[key] = s
        return s, True

    def _static_resident(self, decl: ModuleDecl, bo_key: str, a: Arg) -> bool:
        st = self._static_pool.get(_static_key(decl, bo_key, a))
        return st is not None and st.written

    def _alloc(self, nbytes: int) -> Buffer:
        self.allocated_bytes += nbytes
        return self.device.alloc(nbytes)

    def _counters(self, name: str) -> ModuleCounters:
        c = self.counters.get(name)
        if c is None:
            c = self.counters[name] = ModuleCounters()
        return c

    @staticmethod
    def _check_value(decl: ModuleDecl, arg: Arg, dt: np.dtype, value) -> np.ndarray:
        if not isinstance(value, np.ndarray):
            raise ValueError(f"module {decl.name} arg {arg.name}: expected a numpy array, got {type(value).__name__}")
        if value.dtype != dt:
            raise ValueError(f"module {decl.name} arg {arg.name}: dtype {value.dtype}, expected {arg.dtype}")
        if value.shape != arg.shape:
            raise ValueError(f"module {decl.name} arg {arg.name}: shape {value.shape}, expected {arg.shape}")
        return value

    def _bind(self, decl: ModuleDecl, args: tuple, named: dict) -> list:
        rows, index = self._plan(decl)
        if len(args) > len(rows):
            raise ValueError(f"module {decl.name}: {len(args)} positional args for {len(rows)} declared arguments")
        values = list(args) + [None] * (len(rows) - len(args))
        for k, v in named.items():
            i = index.get(k)
            if i is None:
                raise ValueError(f"module {decl.name}: unknown argument {k!r}; declared: {[a.name for a in decl.args]}")
            if i < len(args) and args[i] is not None:
                raise ValueError(f"module {decl.name} arg {k}: given both positionally and by name")
            values[i] = v
        return values

    def _resolve_ref(self, decl: ModuleDecl, arg: Arg, dt: np.dtype, ref: DeviceRef) -> Buffer:
        """The buffer a ref points at, after checking it can stand in for `arg` (size and dtype)."""
        src = self._decl(ref.module)
        rows, index = self._plan(src)
        i = index.get(ref.arg)
        if i is None:
            raise ValueError(f"module {decl.name} arg {arg.name}: ref to unknown argument {ref.module}.{ref.arg}")
        sarg, sdt, srole = rows[i]
        if srole is Role.STATIC:
            raise ValueError(f"module {decl.name} arg {arg.name}: ref to {ref.module}.{ref.arg}, a static "
                             f"(per-bo_key weights cannot be aliased)")
        if sarg.nbytes != arg.nbytes or sdt != dt:
            raise ValueError(f"module {decl.name} arg {arg.name} ({arg.dtype}, {arg.nbytes} bytes) cannot alias "
                             f"{ref.module}.{ref.arg} ({sarg.dtype}, {sarg.nbytes} bytes)")
        bufs = self._bound.get(ref.module)
        if bufs is None:
            raise ValueError(f"module {decl.name} arg {arg.name}: ref to {ref.module}.{ref.arg}, but "
                             f"{ref.module} has not run yet (its buffer holds nothing)")
        return bufs[i]

    def _program(self, name: str):
        p = self._programs.get(name)
        if p is None:
            from .launch_program import read_launch_program
            p = self._programs[name] = read_launch_program(Path(self.artifacts[name].mlir).read_text())
        return p

    def _check_alias_hazard(self, decl: ModuleDecl, bufs: list[Buffer]) -> None:
        """Two slots of one call on the same buffer are safe only if no launch reads one of them after
        another launch of the run has written the other (launches run in order, on the NPU as on emu)."""
        groups: dict[int, set[int]] = {}
        for i, b in enumerate(bufs):
            groups.setdefault(id(b), set()).add(i)
        shared = {i: g for g in groups.values() if len(g) > 1 for i in g}
        if not shared:
            return
        # The verdict depends only on which slots share a buffer: check each pattern once (decode repeats it
        # every layer of every token).
        pattern = (decl.name, frozenset(frozenset(g) for g in groups.values() if len(g) > 1))
        if pattern in self._safe_alias_patterns:
            return
        written: set[int] = set()
        names = [a.name for a in decl.args]
        for n, launch in enumerate(self._program(decl.name).launches):
            for i in launch.operands[:-1]:
                clobbered = shared.get(i, set()) & written - {i}
                if clobbered:
                    raise ValueError(f"module {decl.name}: arg {names[i]} aliases {names[min(clobbered)]}, which "
                                     f"launch order overwrites before launch {n} ({launch.kind}) reads it")
            out = launch.operands[-1]
            if out in shared:
                written.add(out)
        self._safe_alias_patterns.add(pattern)

    # ---------------------------------------------------------------- public API
    def ref(self, module: str, arg: str) -> DeviceRef:
        """A device-side value for an INPUT of another call: `module.arg`'s buffer as of its last call."""
        decl = self._decl(module)
        if arg not in self._plan(decl)[1]:
            raise ValueError(f"module {module}: unknown argument {arg!r}; declared: {[a.name for a in decl.args]}")
        return DeviceRef(module, arg)

    def write_static(self, name: str, bo_key: str | None = None, **statics: np.ndarray) -> None:
        """Write static arguments (weights, LUTs) of one bo_key ahead of time (e.g. before timing)."""
        decl = self._decl(name)
        rows, index = self._plan(decl)
        bo_key = name if bo_key is None else bo_key
        bset, _ = self._buffer_set(decl, bo_key)
        c = self._counters(name)
        for k, v in statics.items():
            i = index.get(k)
            if i is None:
                raise ValueError(f"module {name}: unknown argument {k!r}")
            arg, dt, role = rows[i]
            if role is not Role.STATIC:
                raise ValueError(f"module {name} arg {k}: role is {role.value}, write_static takes static args only")
            self._check_value(decl, arg, dt, v)
            st = bset.statics[k]
            if st.written:  # already resident (this bo_key, or a sibling module of the family)
                continue
            t0 = time.perf_counter()
            self.device.write(st.buf, v)
            c.write_s += time.perf_counter() - t0
            c.bytes_written += arg.nbytes
            c.static_bytes_written += arg.nbytes
            st.written = True

    preload = write_static

    def load_and_run(self, name: str, *args, bo_key: str | None = None, read: Iterable[str] | None = None,
                     **named) -> dict[str, np.ndarray]:
        """Run one module. INPUTs are host arrays or `ref(...)`s (bound on the device, 0 bytes);
        `read` names the outputs to read back (default all; the rest stay on the device)."""
        decl = self._decl(name)
        rows, index = self._plan(decl)
        values = self._bind(decl, args, named)
        if read is not None:
            read = set(read)
            bad = sorted(r for r in read if r not in index or rows[index[r]][2] is not Role.OUTPUT)
            if bad:
                raise ValueError(f"module {name}: read= names {bad}, which are not outputs; "
                                 f"outputs: {list(decl.names(Role.OUTPUT))}")
        refs: dict[int, Buffer] = {}
        bo_key = name if bo_key is None else bo_key
        # Validate everything before touching the device so a bad call transfers nothing.
        for i, ((arg, dt, role), v) in enumerate(zip(rows, values)):
            if role is Role.INPUT:
                if v is None:
                    raise ValueError(f"module {name} arg {arg.name}: input missing (inputs are written every call)")
                if isinstance(v, DeviceRef):
                    refs[i] = self._resolve_ref(decl, arg, dt, v)
                else:
                    self._check_value(decl, arg, dt, v)
            elif isinstance(v, DeviceRef):
                raise ValueError(f"module {name} arg {arg.name}: role {role.value} cannot take a ref "
                                 f"(only inputs can be bound to another module's buffer)")
            elif role is Role.STATIC:
                if v is None:
                    # resident through this bo_key or a sibling module of the family (shared pool)
                    if not self._static_resident(decl, bo_key, arg):
                        raise ValueError(f"module {name} arg {arg.name}: static missing on the first call "
                                         f"of bo_key {bo_key!r}")
                else:
                    self._check_value(decl, arg, dt, v)
            elif v is not None:
                raise ValueError(f"module {name} arg {arg.name}: role {role.value} is never written by the "
                                 f"host; pass None")
        handle = self._handle(name)
        bset, _ = self._buffer_set(decl, bo_key)
        bufs = bset.buffers
        if refs:
            bufs = list(bufs)
            for i, b in refs.items():
                bufs[i] = b
            self._check_alias_hazard(decl, bufs)
        c = self._counters(name)
        dev = self.device

        t0 = time.perf_counter()
        for i, ((arg, dt, role), v) in enumerate(zip(rows, values)):
            if i in refs:
                continue  # already on the device
            if role is Role.INPUT:
                dev.write(bufs[i], v)
                c.bytes_written += arg.nbytes
            elif role is Role.STATIC and v is not None and not bset.statics[arg.name].written:
                dev.write(bufs[i], v)
                c.bytes_written += arg.nbytes
                c.static_bytes_written += arg.nbytes
                bset.statics[arg.name].written = True
        t1 = time.perf_counter()
        dev.run(handle, bufs)
        self._bound[name] = bufs
        t2 = time.perf_counter()
        out: dict[str, np.ndarray] = {}
        for i, (arg, dt, role) in enumerate(rows):
            if role is Role.OUTPUT and (read is None or arg.name in read):
                out[arg.name] = dev.read(bufs[i], arg.shape, dt)
                c.bytes_read += arg.nbytes
        t3 = time.perf_counter()
        c.calls += 1
        c.write_s += t1 - t0
        c.run_s += t2 - t1
        c.read_s += t3 - t2
        return out

    def free(self, name: str, bo_key: str | None = None) -> None:
        """Release one module's buffer set (the next call of that bo_key starts fresh)."""
        bo_key = name if bo_key is None else bo_key
        bset = self._sets.pop((name, bo_key), None)
        if bset is None:
            return
        decl = self._decl(name)
        for a, b in zip(decl.args, bset.buffers):
            if a.role is Role.STATIC:
                pkey = _static_key(decl, bo_key, a)
                st = self._static_pool[pkey]
                st.users -= 1
                if st.users:
                    continue
                del self._static_pool[pkey]
            else:
                slot = self._act_pool[(name, a.name)]
                slot[1] -= 1
                if slot[1]:
                    continue
                del self._act_pool[(name, a.name)]
            self.allocated_bytes -= b.nbytes
            self.device.free(b)
            # a ref must never resolve to a freed buffer
            for m, bl in list(self._bound.items()):
                if any(x is b for x in bl):
                    del self._bound[m]

    def bo_keys(self, name: str) -> list[str]:
        return [k for (n, k) in self._sets if n == name]

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
        """Bytes held by this cache's buffer sets, and the device's own live/peak totals."""
        stats = getattr(self.device, "stats", None)
        return {"cache_allocated_bytes": self.allocated_bytes,
                "device_allocated_bytes": getattr(stats, "allocated_bytes", None),
                "device_peak_allocated_bytes": getattr(stats, "peak_allocated_bytes", None)}
