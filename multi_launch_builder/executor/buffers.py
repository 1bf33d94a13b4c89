"""The device buffers a ModuleExecutor holds: allocation accounting, the shared static and activation pools,
one buffer set per (module, bo_key), cached sub-buffer views, the buffer list of each module's last call (what
a ref resolves to) and the value each scalar buffer last received.

Sharing (docs/cache.md): a static buffer belongs to (module family, bo_key, arg name, shape, dtype); input,
intermediate, output and scalar buffers belong to the module and are shared by all its bo_keys (calls run one
at a time); STATE slots stay empty here (multi_launch_builder.executor.state binds them per call).
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np

from ..decl import Arg, ModuleDecl, Role
from ..devices.base import Buffer, Device

_MAX_VIEWS = 512   # cached state-window views (a decode step makes one per layer and position)


@dataclass
class StaticSlot:
    buf: Buffer
    written: bool = False
    users: int = 0


@dataclass
class BufferSet:
    buffers: list                                                   # Buffer, or None for STATE slots
    statics: dict[str, StaticSlot] = field(default_factory=dict)   # static arg name -> shared slot


def static_key(decl: ModuleDecl, bo_key: str, a: Arg) -> tuple:
    """The pool key of a static: (family, bo_key, name, shape, dtype); an argument naming its own bo_key or the
    static it shares (decl.Arg) keys that buffer instead."""
    group, name = a.shares if a.shares else (decl.static_group, a.name)
    return (group, a.bo_key or bo_key, name, a.shape, a.dtype)


class DeviceMemory:
    def __init__(self, device: Device):
        self.device = device
        self.allocated_bytes = 0
        self.sets: dict[tuple[str, str], BufferSet] = {}
        self.static_pool: dict[tuple, StaticSlot] = {}
        self.act_pool: dict[tuple[str, str], list] = {}        # (module, arg) -> [buffer, users]
        self.views: OrderedDict = OrderedDict()                 # (id(parent), offset, nbytes) -> view
        self.scalar_seen: dict[int, int] = {}                   # id(scalar buffer) -> value last written
        self.bound: dict[str, list[Buffer]] = {}                # module -> the buffer list of its last call

    def alloc(self, nbytes: int) -> Buffer:
        self.allocated_bytes += nbytes
        return self.device.alloc(nbytes)

    def release(self, buf: Buffer) -> None:
        self.allocated_bytes -= buf.nbytes
        self.device.free(buf)
        for m, bl in list(self.bound.items()):   # a ref must never resolve to a freed buffer
            if any(x is buf or getattr(x, "root", None) is buf for x in bl if x is not None):
                del self.bound[m]

    def view(self, parent: Buffer, offset: int, nbytes: int) -> Buffer:
        """A sub-buffer, cached (a device run binds buffer objects; the same window keeps the same object)."""
        if offset == 0 and nbytes == parent.nbytes:
            return parent
        key = (id(parent), offset, nbytes)
        v = self.views.get(key)
        if v is None:
            v = self.views[key] = self.device.view(parent, offset, nbytes)
            if len(self.views) > _MAX_VIEWS:
                self.views.popitem(last=False)
        else:
            self.views.move_to_end(key)
        return v

    def drop_views(self, parent: Buffer) -> None:
        """Forget the cached views into `parent` (before it is released)."""
        self.views = OrderedDict((k, v) for k, v in self.views.items() if k[0] != id(parent))

    def buffer_set(self, decl: ModuleDecl, bo_key: str) -> BufferSet:
        key = (decl.name, bo_key)
        s = self.sets.get(key)
        if s is not None:
            return s
        bufs, statics = [], {}
        for a in decl.args:
            if a.role is Role.STATE:
                bufs.append(None)      # bound per call to a window of the state buffer
            elif a.role is Role.STATIC:
                pkey = static_key(decl, bo_key, a)
                st = self.static_pool.get(pkey)
                if st is None:
                    st = self.static_pool[pkey] = StaticSlot(self.alloc(a.nbytes))
                st.users += 1
                statics[a.name] = st
                bufs.append(st.buf)
            else:
                slot = self.act_pool.get((decl.name, a.name))
                if slot is None:
                    slot = self.act_pool[(decl.name, a.name)] = [self.alloc(a.nbytes), 0]
                slot[1] += 1
                bufs.append(slot[0])
        s = BufferSet(bufs, statics)
        self.sets[key] = s
        return s

    def static_resident(self, decl: ModuleDecl, bo_key: str, a: Arg) -> bool:
        st = self.static_pool.get(static_key(decl, bo_key, a))
        return st is not None and st.written

    def free_set(self, decl: ModuleDecl, bo_key: str) -> None:
        """Release one buffer set; a pooled buffer goes back to the device when its last user is freed."""
        bset = self.sets.pop((decl.name, bo_key), None)
        if bset is None:
            return
        for a, b in zip(decl.args, bset.buffers):
            if a.role is Role.STATE:
                continue
            if a.role is Role.STATIC:
                pkey = static_key(decl, bo_key, a)
                st = self.static_pool[pkey]
                st.users -= 1
                if st.users:
                    continue
                del self.static_pool[pkey]
            else:
                slot = self.act_pool[(decl.name, a.name)]
                slot[1] -= 1
                if slot[1]:
                    continue
                del self.act_pool[(decl.name, a.name)]
                self.scalar_seen.pop(id(b), None)
            self.release(b)

    def write_scalar(self, buf: Buffer, value: int) -> int:
        """Write one i32 unless the buffer already holds it; the bytes transferred (4 or 0)."""
        if self.scalar_seen.get(id(buf)) == value:
            return 0
        self.device.write(buf, np.array([value], dtype=np.int32))
        self.scalar_seen[id(buf)] = value
        return 4

    def bo_keys(self, name: str) -> list[str]:
        return [k for (n, k) in self.sets if n == name]
