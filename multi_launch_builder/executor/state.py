"""STATE buffers of a ModuleExecutor: persistent buffer families (a layer's K/V cache, the RoPE table) that
kernels read and write in place through windows, and that the host moves only on request.

A state is `rows` rows of `row_nbytes` bytes, one buffer per bo_key (per_key) or one for all; a STATE argument
is a window of `shape[0]` rows starting at the row its `at` scalar names (docs/cache.md, "State windows").
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Iterable

import numpy as np

from ..decl import Arg, ModuleDecl, Role
from ..devices.base import Buffer
from kernel_builder.dtypes import dtype as _dtype
from multi_launch_builder.executor.buffers import DeviceMemory


@dataclass
class State:
    """A persistent buffer family: `rows` rows of `row_nbytes` bytes, one buffer per bo_key (per_key) or one."""

    name: str
    row_nbytes: int
    dtype: str
    row_shape: tuple[int, ...]
    rows: int = 0
    per_key: bool = True
    bufs: dict = field(default_factory=dict)   # bo_key (or None) -> Buffer


def collect_states(decls: Iterable[ModuleDecl]) -> dict[str, State]:
    """Every state the modules use; all windows of one state must agree on row shape and dtype."""
    states: dict[str, State] = {}
    for d in decls:
        for name, a in d.states().items():
            for w in (x for x in d.args if x.role is Role.STATE and x.state_name == name):
                st = states.get(name)
                if st is None:
                    states[name] = State(name, w.row_nbytes, w.dtype, w.shape[1:])
                elif (st.row_shape, st.dtype) != (w.shape[1:], w.dtype):
                    raise ValueError(f"state {name!r}: module {d.name} arg {w.name} has rows {list(w.shape[1:])} "
                                     f"{w.dtype}, another window has {list(st.row_shape)} {st.dtype}")
    return states


class StateStore:
    """The states of one cache; `counters(name)` gives the ModuleCounters transfers are counted under."""

    def __init__(self, decls: Iterable[ModuleDecl], mem: DeviceMemory, counters: Callable):
        self.states = collect_states(decls)
        self._mem = mem
        self._counters = counters

    def _buffer(self, st: State, bo_key: str | None) -> Buffer:
        key = bo_key if st.per_key else None
        buf = st.bufs.get(key)
        if buf is None:
            buf = st.bufs[key] = self._mem.alloc(st.rows * st.row_nbytes)
        return buf

    def window(self, decl: ModuleDecl, arg: Arg, bo_key: str, scalars: dict[str, int]) -> Buffer:
        """The sub-buffer a STATE argument binds to in this call (checked against the state's rows)."""
        st = self.states[arg.state_name]
        if st.rows == 0:
            raise ValueError(f"module {decl.name} arg {arg.name}: state {st.name!r} has no capacity yet "
                             f"(ModuleExecutor.define_state({st.name!r}, rows))")
        row0 = (scalars[arg.at] if arg.at else 0) if isinstance(arg.at, str) else arg.at
        rows = arg.shape[0]
        if row0 < 0 or row0 + rows > st.rows:
            raise ValueError(f"module {decl.name} arg {arg.name}: window rows [{row0}, {row0 + rows}) of state "
                             f"{st.name!r} are outside its {st.rows} rows")
        return self._mem.view(self._buffer(st, arg.bo_key or bo_key), row0 * st.row_nbytes, arg.nbytes)

    def define(self, name: str, rows: int, per_key: bool = True) -> None:
        st = self.states.get(name)
        if st is None:
            raise ValueError(f"unknown state {name!r}; the declared modules use {sorted(self.states)}")
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
            new = st.bufs[key] = self._mem.alloc(rows * st.row_nbytes)
            self._mem.device.copy(new, buf, min(buf.nbytes, new.nbytes))
            self._mem.drop_views(buf)
            self._mem.release(buf)

    def read(self, name: str, bo_key: str, start: int = 0, stop: int | None = None) -> np.ndarray:
        st = self.states[name]
        stop = st.rows if stop is None else stop
        if not 0 <= start < stop <= st.rows:
            raise ValueError(f"state {name!r}: rows [{start}, {stop}) outside its {st.rows} rows")
        nbytes = (stop - start) * st.row_nbytes
        buf = self._mem.view(self._buffer(st, bo_key), start * st.row_nbytes, nbytes)
        c = self._counters(f"state:{name}")
        t0 = time.perf_counter()
        dt = _dtype(st.dtype)
        out = self._mem.device.read(buf, (stop - start,) + dt.host_shape(st.row_shape), dt.host)
        c.read_s += time.perf_counter() - t0
        c.bytes_read += nbytes
        return out

    def write(self, name: str, data: np.ndarray, bo_key: str | None = None, start: int = 0) -> None:
        st = self.states[name]
        dt = _dtype(st.dtype)
        rows = data.shape[0] if data.ndim else 0
        if data.dtype != dt.host or data.shape[1:] != dt.host_shape(st.row_shape):
            raise ValueError(f"state {name!r}: rows of {data.shape[1:]} {data.dtype}, expected "
                             f"{dt.host_shape(st.row_shape)} {st.dtype}")
        if not (0 <= start and 0 < rows and start + rows <= st.rows):
            raise ValueError(f"state {name!r}: rows [{start}, {start + rows}) outside its {st.rows} rows")
        buf = self._mem.view(self._buffer(st, bo_key), start * st.row_nbytes, rows * st.row_nbytes)
        c = self._counters(f"state:{name}")
        t0 = time.perf_counter()
        self._mem.device.write(buf, np.ascontiguousarray(data))
        c.write_s += time.perf_counter() - t0
        c.bytes_written += rows * st.row_nbytes

    def nbytes(self) -> int:
        return sum(b.nbytes for st in self.states.values() for b in st.bufs.values())
