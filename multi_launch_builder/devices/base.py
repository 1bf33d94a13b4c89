"""The device line: everything above it (builders, stitcher, cache, runtime) is device-agnostic.

A Device loads a compiled artifact once, allocates buffers, moves bytes with the XRT-like
write/sync/read contract and dispatches one run of a loaded module over a list of buffers
(one per argument of the module's combined signature).
"""
from __future__ import annotations

import abc
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np


@dataclass(frozen=True)
class Artifact:
    """What the build driver produced for one module (paths inside the cache directory)."""

    name: str                       # module name
    mlir: Path                      # the stitched module text (always present)
    binary: Path | None = None      # .elf (npu); None for emu/null
    insts: Path | None = None       # instruction stream for the xclbin flow (npu, optional)
    xclbin: Path | None = None      # xclbin flow (npu, optional)
    kernel: str = "main"            # kernel symbol inside the ELF / xclbin
    meta: dict = field(default_factory=dict)


class Buffer(abc.ABC):
    """One device buffer (an XRT BO on the NPU, host memory on emu)."""

    nbytes: int


class Device(abc.ABC):
    name: str = "abstract"
    # Loaded modules the device can hold at once (hardware contexts on the NPU); None = no limit.
    max_loaded: int | None = None

    @abc.abstractmethod
    def load(self, artifact: Artifact) -> object:
        """Load one module's binary once; returns an opaque handle passed to run()."""

    @abc.abstractmethod
    def alloc(self, nbytes: int) -> Buffer:
        """Allocate a zero-initialised device buffer."""

    @abc.abstractmethod
    def write(self, buf: Buffer, data: np.ndarray) -> None:
        """Copy host bytes into the buffer and sync them to the device (len(data.tobytes()) == buf.nbytes)."""

    def fill(self, buf: Buffer, writer) -> None:
        """Let `writer(view)` write the buffer's bytes in place (`view`: a writable uint8 array of
        buf.nbytes, the buffer's host mapping) and sync them to the device. The weight loader reads a tensor
        from its file straight into that view, so no second host copy exists. Default: a staging array."""
        staging = np.zeros(buf.nbytes, dtype=np.uint8)
        writer(staging)
        self.write(buf, staging)

    @abc.abstractmethod
    def read(self, buf: Buffer, shape: tuple[int, ...], dtype) -> np.ndarray:
        """Sync the buffer from the device and return a host copy with the given shape/dtype."""

    @abc.abstractmethod
    def run(self, handle: object, buffers: list[Buffer]) -> None:
        """Dispatch one run of a loaded module; raises DeviceRunError naming the module on failure."""

    @abc.abstractmethod
    def view(self, buf: Buffer, offset: int, nbytes: int) -> Buffer:
        """A sub-buffer: `nbytes` of `buf` starting at byte `offset`, sharing its memory (an XRT sub-bo on
        the NPU). A kernel bound to it reads and writes the parent's bytes; it allocates nothing."""

    def copy(self, dst: Buffer, src: Buffer, nbytes: int) -> None:
        """Copy the first `nbytes` of `src` into `dst` (default: through the host; devices override)."""
        data = self.read(src, (src.nbytes,), np.uint8)
        head = self.read(dst, (dst.nbytes,), np.uint8)
        head[:nbytes] = data[:nbytes]
        self.write(dst, head)

    def free(self, buf: Buffer) -> None:
        """Release a buffer (optional; devices that track memory override it)."""

    def unload(self, handle: object) -> None:
        """Release a loaded module (its hardware context on the NPU); buffers stay valid."""
        self.stats.unloads += 1

    def close(self) -> None:  # pragma: no cover - optional
        pass


class DeviceRunError(RuntimeError):
    pass


@dataclass
class DeviceStats:
    """Traffic and memory counters every device keeps (exact byte counts of transfers)."""

    loads: int = 0
    unloads: int = 0
    runs: int = 0
    bytes_written: int = 0
    bytes_read: int = 0
    allocated_bytes: int = 0      # live device memory held by buffers allocated on this device
    peak_allocated_bytes: int = 0

    def on_alloc(self, nbytes: int) -> None:
        self.allocated_bytes += nbytes
        self.peak_allocated_bytes = max(self.peak_allocated_bytes, self.allocated_bytes)

    def on_free(self, nbytes: int) -> None:
        self.allocated_bytes -= nbytes

    @property
    def live_loaded(self) -> int:
        return self.loads - self.unloads


def check_nbytes(buf: Buffer, data: np.ndarray, what: str = "write") -> np.ndarray:
    """The data as a flat uint8 view; ValueError when its size differs from the buffer's."""
    arr = np.ascontiguousarray(data)
    raw = arr.reshape(-1).view(np.uint8)
    if raw.size != buf.nbytes:
        raise ValueError(f"{what}: {raw.size} bytes for a buffer of {buf.nbytes} bytes")
    return raw


def check_view(buf: Buffer, offset: int, nbytes: int) -> None:
    if offset < 0 or nbytes <= 0 or offset + nbytes > buf.nbytes:
        raise ValueError(f"view of {nbytes} bytes at offset {offset} outside a buffer of {buf.nbytes} bytes")
    if offset % 4:
        raise ValueError(f"view offset {offset} is not 4-byte aligned (NPU DMA addresses are 32-bit words)")


def check_read(buf: Buffer, shape, dtype) -> np.dtype:
    """The dtype to read as; ValueError when shape x dtype does not cover the buffer exactly."""
    dt = np.dtype(dtype)
    if math.prod(shape) * dt.itemsize != buf.nbytes:
        raise ValueError(f"read of shape {tuple(shape)} {dt} from a buffer of {buf.nbytes} bytes")
    return dt
