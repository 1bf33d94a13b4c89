"""Counting device: same buffer/counter semantics as emu, computes nothing.

Used by benchmarks at full model shapes to count dispatches and transferred
bytes; buffers hold no memory (writes are counted, not stored), reads return zeros.
"""
from __future__ import annotations

import numpy as np

from .base import Artifact, Buffer, Device, DeviceRunError, DeviceStats, check_nbytes, check_read, check_view


class NullBuffer(Buffer):
    __slots__ = ("nbytes",)

    def __init__(self, nbytes: int):
        self.nbytes = nbytes


class _Loaded:
    __slots__ = ("name",)

    def __init__(self, name: str):
        self.name = name


class NullDevice(Device):
    name = "null"

    def __init__(self):
        self.stats = DeviceStats()

    def load(self, artifact: Artifact) -> _Loaded:
        self.stats.loads += 1
        return _Loaded(artifact.name)

    def alloc(self, nbytes: int) -> NullBuffer:
        self.stats.on_alloc(nbytes)
        return NullBuffer(nbytes)

    def view(self, buf: NullBuffer, offset: int, nbytes: int) -> NullBuffer:
        check_view(buf, offset, nbytes)
        return NullBuffer(nbytes)

    def copy(self, dst: Buffer, src: Buffer, nbytes: int) -> None:
        pass

    def free(self, buf: Buffer) -> None:
        self.stats.on_free(buf.nbytes)

    def write(self, buf: NullBuffer, data: np.ndarray) -> None:
        check_nbytes(buf, data)
        self.stats.bytes_written += buf.nbytes

    def read(self, buf: NullBuffer, shape, dtype) -> np.ndarray:
        dt = check_read(buf, shape, dtype)
        self.stats.bytes_read += buf.nbytes
        return np.zeros(shape, dtype=dt)

    def run(self, handle: _Loaded, buffers: list[Buffer]) -> None:
        if not isinstance(handle, _Loaded):
            raise DeviceRunError(f"null device: run() with a handle it did not load: {handle!r}")
        self.stats.runs += 1
