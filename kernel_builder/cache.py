"""KernelCache: compile-once artifacts, one loaded binary per module, one buffer set per bo_key.

Transfer contract (roles come from the ModuleDecl, never re-typed; docs/cache.md):
- input        : written by the host on every call, or bound to another module's buffer (`ref`, 0 bytes);
- static       : written on the first call of a bo_key (or by write_static), then kept;
- state        : a window of a persistent buffer (per bo_key or shared), starting at the row a scalar names;
                 kernels read and write it in place; the host never transfers it unless asked (read_state);
- scalar       : one i32 per call (4 bytes, not re-sent while unchanged);
- intermediate : device-only, never transferred (zero on allocation);
- output       : never written by the host; read back after a call (`read=` selects which).
Counters are exact: bytes_written / bytes_read are the bytes actually transferred.

Buffer sharing (device memory): a static buffer belongs to (module family, bo_key, arg name, shape, dtype);
input, intermediate, output and scalar buffers belong to the module and are shared by all its bo_keys
(calls run one at a time); state buffers belong to (state name, bo_key) or to the state name alone.

Hand-off policy: with handoff="device" (default) a ref binds the producer's buffer; with handoff="host"
the same call copies it through the host (read back, written into the consumer's own buffer, counted), so
the runtime has one code path and the policy decides where activations travel.
"""
from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Mapping

import numpy as np

from .decl import Arg, ModuleDecl, Role
from .devices.base import Artifact, Buffer, Device
from .dtypes import dtype as _dtype

HANDOFFS = ("device", "host")
_MAX_VIEWS = 512   # cached state-window views (a decode step makes one per layer and position)


def numpy_dtype(arg: Arg) -> np.dtype:
    """Host dtype of an argument's array (bf16 -> ml_dtypes.bfloat16, i4 -> packed uint8)."""
    return _dtype(arg.dtype).host


def host_shape(arg: Arg) -> tuple[int, ...]:
    return _dtype(arg.dtype).host_shape(arg.shape)


@dataclass
class ModuleCounters:
    calls: int = 0
    bytes_written: int = 0        # every host->device byte (inputs, statics, scalars, host hand-offs)
    static_bytes_written: int = 0 # the part of bytes_written that was statics
    bytes_read: int = 0
    write_s: float = 0.0
    run_s: float = 0.0
    read_s: float = 0.0


@dataclass(frozen=True)
class DeviceRef:
    """An INPUT value meaning "the device buffer `module.arg` used in that module's last call"
    (made by KernelCache.ref), or with `row`, the part of it starting at that leading-dimension row.
    Its contents are whatever the device holds there when the call runs."""

    module: str
    arg: str
    row: int | None = None


@dataclass
class _Static:
    buf: Buffer
    written: bool = False
    users: int = 0


@dataclass
class _BufferSet:
    buffers: list                                                # Buffer, or None for STATE slots
    statics: dict[str, _Static] = field(default_factory=dict)   # static arg name -> shared slot


@dataclass
class _State:
    """A persistent buffer family: `rows` rows of `row_nbytes` bytes, one buffer per bo_key (per_key) or one."""

    name: str
    row_nbytes: int
    dtype: str
    row_shape: tuple[int, ...]
    rows: int = 0
    per_key: bool = True
    bufs: dict = field(default_factory=dict)   # bo_key (or None) -> Buffer


def _static_key(decl: ModuleDecl, bo_key: str, a: Arg) -> tuple:
    return (decl.static_group, bo_key, a.name, a.shape, a.dtype)


class KernelCache:
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
            from .build import load_artifacts
            artifacts = load_artifacts(Path(artifacts), getattr(device, "name", "emu"), list(self.decls.values()))
        self.artifacts: dict[str, Artifact] = dict(artifacts)
        self._handles: OrderedDict[str, object] = OrderedDict()   # loaded modules, least recently used first
        self._sets: dict[tuple[str, str], _BufferSet] = {}
        self._static_pool: dict[tuple, _Static] = {}
        self._act_pool: dict[tuple[str, str], list] = {}        # (module, arg) -> [buffer, users]
        self._states: dict[str, _State] = self._collect_states()
        self._views: OrderedDict = OrderedDict()                 # (id(parent), offset, nbytes) -> view
        self._scalar_seen: dict[int, int] = {}                   # id(scalar buffer) -> value last written
        self._resident: set[tuple[str, str]] = set()             # (module, bo_key) whose statics are all written
        self._safe_alias_patterns: set[tuple] = set()
        self.counters: dict[str, ModuleCounters] = {}
        self.allocated_bytes = 0
        self._plans: dict[str, tuple] = {}
        self._bound: dict[str, list[Buffer]] = {}   # module -> the buffer list of its last call (refs)
        self._programs: dict[str, object] = {}      # module -> LaunchProgram (alias hazard checks)

    # ---------------------------------------------------------------- internals
    def _collect_states(self) -> dict[str, _State]:
        states: dict[str, _State] = {}
        for d in self.decls.values():
            for name, a in d.states().items():
                for w in (x for x in d.args if x.role is Role.STATE and x.state_name == name):
                    st = states.get(name)
                    if st is None:
                        states[name] = _State(name, w.row_nbytes, w.dtype, w.shape[1:])
                    elif (st.row_shape, st.dtype) != (w.shape[1:], w.dtype):
                        raise ValueError(f"state {name!r}: module {d.name} arg {w.name} has rows {list(w.shape[1:])} "
                                         f"{w.dtype}, another window has {list(st.row_shape)} {st.dtype}")
        return states

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

    def _buffer_set(self, decl: ModuleDecl, bo_key: str) -> _BufferSet:
        key = (decl.name, bo_key)
        s = self._sets.get(key)
        if s is not None:
            return s
        bufs, statics = [], {}
        for a in decl.args:
            if a.role is Role.STATE:
                bufs.append(None)      # bound per call to a window of the state buffer
            elif a.role is Role.STATIC:
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
        return s

    def _static_resident(self, decl: ModuleDecl, bo_key: str, a: Arg) -> bool:
        st = self._static_pool.get(_static_key(decl, bo_key, a))
        return st is not None and st.written

    def _alloc(self, nbytes: int) -> Buffer:
        self.allocated_bytes += nbytes
        return self.device.alloc(nbytes)

    def _release(self, buf: Buffer) -> None:
        self.allocated_bytes -= buf.nbytes
        self.device.free(buf)
        for m, bl in list(self._bound.items()):   # a ref must never resolve to a freed buffer
            if any(x is buf or getattr(x, "root", None) is buf for x in bl if x is not None):
                del self._bound[m]

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
        if value.shape != host_shape(arg):
            raise ValueError(f"module {decl.name} arg {arg.name}: shape {value.shape}, expected {host_shape(arg)}")
        return value

    def _bind(self, decl: ModuleDecl, args: tuple, named: dict) -> tuple[list, dict[str, int]]:
        rows, index = self._plan(decl)
        if len(args) > len(rows):
            raise ValueError(f"module {decl.name}: {len(args)} positional args for {len(rows)} declared arguments")
        values = list(args) + [None] * (len(rows) - len(args))
        scalars: dict[str, int] = {}
        for k, v in named.items():
            i = index.get(k)
            if k in decl.scalars:
                if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
                    raise ValueError(f"module {decl.name} scalar {k}: expected an int, got {v!r}")
                if not -2**31 <= int(v) < 2**31:
                    raise ValueError(f"module {decl.name} scalar {k}: {v} does not fit an i32")
                scalars[k] = int(v)
                continue
            if i is None:
                raise ValueError(f"module {decl.name}: unknown argument {k!r}; declared: "
                                 f"{[a.name for a in decl.args] + list(decl.scalars)}")
            if i < len(args) and args[i] is not None:
                raise ValueError(f"module {decl.name} arg {k}: given both positionally and by name")
            values[i] = v
        missing = [s for s in decl.scalars if s not in scalars]
        if missing:
            raise ValueError(f"module {decl.name}: scalar {missing[0]!r} missing (pass {missing[0]}=<int>)")
        return values, scalars

    def _resolve_ref(self, decl: ModuleDecl, arg: Arg, ref: DeviceRef) -> Buffer:
        """The buffer a ref points at, after checking it can stand in for `arg` (size and dtype)."""
        src = self._decl(ref.module)
        rows, index = self._plan(src)
        i = index.get(ref.arg)
        if i is None:
            raise ValueError(f"module {decl.name} arg {arg.name}: ref to unknown argument {ref.module}.{ref.arg}")
        sarg, _, srole = rows[i]
        if srole in (Role.STATIC, Role.SCALAR, Role.STATE):
            raise ValueError(f"module {decl.name} arg {arg.name}: ref to {ref.module}.{ref.arg}, a {srole.value} "
                             f"(weights, scalars and state windows are bound per call, not aliased)")
        offset = 0 if ref.row is None else ref.row * sarg.row_nbytes
        if ref.row is not None and not 0 <= offset <= sarg.nbytes - arg.nbytes:
            raise ValueError(f"module {decl.name} arg {arg.name}: ref to row {ref.row} of {ref.module}.{ref.arg} "
                             f"({sarg.shape[0]} rows) does not leave {arg.nbytes} bytes")
        if (ref.row is None and sarg.nbytes != arg.nbytes) or sarg.dtype != arg.dtype:
            raise ValueError(f"module {decl.name} arg {arg.name} ({arg.dtype}, {arg.nbytes} bytes) cannot alias "
                             f"{ref.module}.{ref.arg} ({sarg.dtype}, {sarg.nbytes} bytes)")
        bufs = self._bound.get(ref.module)
        if bufs is None:
            raise ValueError(f"module {decl.name} arg {arg.name}: ref to {ref.module}.{ref.arg}, but "
                             f"{ref.module} has not run yet (its buffer holds nothing)")
        if ref.row is None:
            return bufs[i]
        return self._view(bufs[i], offset, arg.nbytes)

    def _state_window(self, decl: ModuleDecl, arg: Arg, bo_key: str, scalars: dict[str, int]) -> Buffer:
        st = self._states[arg.state_name]
        if st.rows == 0:
            raise ValueError(f"module {decl.name} arg {arg.name}: state {st.name!r} has no capacity yet "
                             f"(KernelCache.define_state({st.name!r}, rows))")
        row0 = scalars[arg.at] if arg.at else 0
        rows = arg.shape[0]
        if row0 < 0 or row0 + rows > st.rows:
            raise ValueError(f"module {decl.name} arg {arg.name}: window rows [{row0}, {row0 + rows}) of state "
                             f"{st.name!r} are outside its {st.rows} rows")
        return self._view(self._state_buffer(st, bo_key), row0 * st.row_nbytes, arg.nbytes)

    def _view(self, parent: Buffer, offset: int, nbytes: int) -> Buffer:
        """A sub-buffer, cached (a device run binds buffer objects; the same window keeps the same object)."""
        if offset == 0 and nbytes == parent.nbytes:
            return parent
        key = (id(parent), offset, nbytes)
        v = self._views.get(key)
        if v is None:
            v = self._views[key] = self.device.view(parent, offset, nbytes)
            if len(self._views) > _MAX_VIEWS:
                self._views.popitem(last=False)
        else:
            self._views.move_to_end(key)
        return v

    def _state_buffer(self, st: _State, bo_key: str) -> Buffer:
        key = bo_key if st.per_key else None
        buf = st.bufs.get(key)
        if buf is None:
            buf = st.bufs[key] = self._alloc(st.rows * st.row_nbytes)
        return buf

    def _program(self, name: str):
        p = self._programs.get(name)
        if p is None:
            from .launch_program import read_launch_program
            p = self._programs[name] = read_launch_program(Path(self.artifacts[name].mlir).read_text())
        return p

    @staticmethod
    def _extent(b: Buffer) -> tuple[int, int, int]:
        root = getattr(b, "root", None)
        if root is not None and root is not b:
            return id(root), b.offset, b.offset + b.nbytes
        return id(b), 0, b.nbytes

    def _check_alias_hazard(self, decl: ModuleDecl, bufs: list[Buffer], refs: Iterable[int]) -> None:
        """Two slots of one call on overlapping memory are safe only if no launch reads one of them after
        another launch of the run has written the other (launches run in order, on the NPU as on emu).
        Only a ref can make a slot overlap another (windows of one state may overlap each other: reading what
        an earlier launch wrote there is their purpose), so only the ref'd slots are compared."""
        others = [j for j, a in enumerate(decl.args) if a.role is not Role.STATE]   # refs never reach states
        ext = {j: self._extent(bufs[j]) for j in others}
        overlap: dict[int, set[int]] = {}
        for i in refs:
            ri, si, ei = ext[i]
            for j in others:
                rj, sj, ej = ext[j]
                if j != i and ri == rj and si < ej and sj < ei:
                    overlap.setdefault(i, set()).add(j)
                    overlap.setdefault(j, set()).add(i)
        if not overlap:
            return
        pattern = (decl.name, frozenset((i, frozenset(s)) for i, s in overlap.items()))
        if pattern in self._safe_alias_patterns:
            return
        written: set[int] = set()
        names = [a.name for a in decl.args]
        for n, launch in enumerate(self._program(decl.name).launches):
            for i in launch.read_args:
                clobbered = overlap.get(i, set()) & written
                if clobbered:
                    raise ValueError(f"module {decl.name}: arg {names[i]} aliases {names[min(clobbered)]}, which "
                                     f"launch order overwrites before launch {n} ({launch.kind}) reads it")
            written.update(o for o in launch.written_args if o in overlap)
        self._safe_alias_patterns.add(pattern)

    def _write_scalar(self, buf: Buffer, value: int, c: ModuleCounters) -> None:
        if self._scalar_seen.get(id(buf)) == value:
            return
        self.device.write(buf, np.array([value], dtype=np.int32))
        self._scalar_seen[id(buf)] = value
        c.bytes_written += 4

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
        st = self._states.get(name)
        if st is None:
            raise ValueError(f"unknown state {name!r}; the declared modules use {sorted(self._states)}")
        if not isinstance(rows, int) or rows <= 0:
            raise ValueError(f"state {name!r}: rows must be a positive int, got {rows!r}")
        if st.bufs and st.per_key != per_key:
            raise ValueError(f"state {name!r} is already allocated with per_key={st.per_key}")
        st.per_key = per_key
        if rows == st.rows:
            return
        old, st.rows = st.bufs, rows
        st.bufs = {}
        for key, buf in old.items():
            new = st.bufs[key] = self._alloc(rows * st.row_nbytes)
            self.device.copy(new, buf, min(buf.nbytes, new.nbytes))
            self._views = OrderedDict((k, v) for k, v in self._views.items() if k[0] != id(buf))
            self._release(buf)

    def state_rows(self, name: str) -> int:
        return self._states[name].rows if name in self._states else 0

    def read_state(self, name: str, bo_key: str, start: int = 0, stop: int | None = None) -> np.ndarray:
        """Host copy of rows [start, stop) of a state buffer (counted under `state:<name>`)."""
        st = self._states[name]
        stop = st.rows if stop is None else stop
        if not 0 <= start < stop <= st.rows:
            raise ValueError(f"state {name!r}: rows [{start}, {stop}) outside its {st.rows} rows")
        nbytes = (stop - start) * st.row_nbytes
        buf = self._view(self._state_buffer(st, bo_key), start * st.row_nbytes, nbytes)
        c = self._counters(f"state:{name}")
        t0 = time.perf_counter()
        dt = _dtype(st.dtype)
        out = self.device.read(buf, (stop - start,) + dt.host_shape(st.row_shape), dt.host)
        c.read_s += time.perf_counter() - t0
        c.bytes_read += nbytes
        return out

    def write_state(self, name: str, data: np.ndarray, bo_key: str | None = None, start: int = 0) -> None:
        """Host rows into a state buffer at row `start` (e.g. the RoPE table once, as it grows); counted
        under `state:<name>`."""
        st = self._states[name]
        dt = _dtype(st.dtype)
        rows = data.shape[0] if data.ndim else 0
        if data.dtype != dt.host or data.shape[1:] != dt.host_shape(st.row_shape):
            raise ValueError(f"state {name!r}: rows of {data.shape[1:]} {data.dtype}, expected "
                             f"{dt.host_shape(st.row_shape)} {st.dtype}")
        if not (0 <= start and 0 < rows and start + rows <= st.rows):
            raise ValueError(f"state {name!r}: rows [{start}, {start + rows}) outside its {st.rows} rows")
        buf = self._view(self._state_buffer(st, bo_key), start * st.row_nbytes, rows * st.row_nbytes)
        c = self._counters(f"state:{name}")
        t0 = time.perf_counter()
        self.device.write(buf, np.ascontiguousarray(data))
        c.write_s += time.perf_counter() - t0
        c.bytes_written += rows * st.row_nbytes

    def write_static(self, name: str, bo_key: str | None = None, **statics) -> None:
        """Write static arguments (weights, tables) of one bo_key ahead of time. A value is an array of the
        argument's host shape/dtype, or a callable `fill(view)` that writes the bytes straight into the
        device buffer's host mapping (a uint8 array of the argument's size): the weight loader reads each
        tensor from its file into that view, so no second host copy exists."""
        decl = self._decl(name)
        rows, index = self._plan(decl)
        bo_key = name if bo_key is None else bo_key
        bset = self._buffer_set(decl, bo_key)
        c = self._counters(name)
        for k, v in statics.items():
            i = index.get(k)
            if i is None:
                raise ValueError(f"module {name}: unknown argument {k!r}")
            arg, dt, role = rows[i]
            if role is not Role.STATIC:
                raise ValueError(f"module {name} arg {k}: role is {role.value}, write_static takes static args only")
            if not callable(v):
                self._check_value(decl, arg, dt, v)
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
        values, scalars = self._bind(decl, args, named)
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
                    refs[i] = self._resolve_ref(decl, arg, v)
                else:
                    self._check_value(decl, arg, dt, v)
            elif isinstance(v, DeviceRef):
                raise ValueError(f"module {name} arg {arg.name}: role {role.value} cannot take a ref "
                                 f"(only inputs can be bound to another module's buffer)")
            elif role is Role.STATIC:
                if v is None:
                    if (name, bo_key) not in self._resident and not self._static_resident(decl, bo_key, arg):
                        raise ValueError(f"module {name} arg {arg.name}: static missing on the first call "
                                         f"of bo_key {bo_key!r}")
                else:
                    self._check_value(decl, arg, dt, v)
            elif v is not None:
                raise ValueError(f"module {name} arg {arg.name}: role {role.value} is never written by the "
                                 f"host; pass None" + (" (scalars go by name)" if role is Role.SCALAR else ""))
        windows = {i: self._state_window(decl, arg, bo_key, scalars)
                   for i, (arg, _, role) in enumerate(rows) if role is Role.STATE}
        handle = self._handle(name)
        bset = self._buffer_set(decl, bo_key)
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
            self._check_alias_hazard(decl, bufs, refs)
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
                self._write_scalar(bufs[i], scalars[arg.name], c)
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
                out[arg.name] = dev.read(bufs[i], host_shape(arg), dt)
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
        self._resident.discard((name, bo_key))
        if bset is None:
            return
        decl = self._decl(name)
        for a, b in zip(decl.args, bset.buffers):
            if a.role is Role.STATE:
                continue
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
                self._scalar_seen.pop(id(b), None)
            self._release(b)

    def free_state(self, name: str) -> None:
        """Release every buffer of a state (its capacity stays defined; buffers come back zeroed)."""
        st = self._states[name]
        for buf in st.bufs.values():
            self._views = OrderedDict((k, v) for k, v in self._views.items() if k[0] != id(buf))
            self._release(buf)
        st.bufs = {}

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
        """Bytes held by this cache's buffers (of which states), and the device's own live/peak totals."""
        stats = getattr(self.device, "stats", None)
        return {"cache_allocated_bytes": self.allocated_bytes,
                "state_bytes": sum(b.nbytes for st in self._states.values() for b in st.bufs.values()),
                "device_allocated_bytes": getattr(stats, "allocated_bytes", None),
                "device_peak_allocated_bytes": getattr(stats, "peak_allocated_bytes", None)}
