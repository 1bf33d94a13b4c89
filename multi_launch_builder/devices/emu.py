"""Software NPU: executes the stitched MLIR text launch by launch.

load() reads the artifact's module text once and derives the launch program (order, kernel kinds,
params, operand -> argument wiring) from the TEXT, so a wiring bug in a builder or the stitcher
shows up as wrong numbers here. Numerics come from the executor (default: the numpy references).

Speed: every buffer keeps its bf16 bytes (what the host reads back) plus a lazily built f32
shadow. Kernels read the shadow, so static bf16 weights are widened once per write, not once per
call; a host write or a kernel output invalidates it.
"""
from __future__ import annotations

import contextlib
from pathlib import Path

import numpy as np

from kernel_builder.dtypes import dtype as _dtype
from kernel_builder.numerics import BF16
from .base import Artifact, Buffer, Device, DeviceRunError, DeviceStats, check_nbytes, check_read, check_view


class EmuBuffer(Buffer):
    """Host bytes standing in for a device buffer. A view (`EmuDevice.view`, a sub-buffer) shares its
    root's bytes. The root keeps one lazily built f32 shadow of its bf16 contents; kernel outputs and host
    writes update the shadow's slice in place (so appending one KV row does not rebuild a whole cache),
    and `invalidate()` (after the interpreter wrote the bytes directly) drops it."""

    __slots__ = ("nbytes", "raw", "root", "offset", "_f32")

    def __init__(self, nbytes: int, root: "EmuBuffer | None" = None, offset: int = 0):
        self.nbytes = nbytes
        if root is None:
            self.raw = np.zeros(nbytes, dtype=np.uint8)
            self.root, self.offset = self, 0
        else:
            self.raw = root.raw[offset:offset + nbytes]
            self.root, self.offset = root, offset
        self._f32: np.ndarray | None = None

    def invalidate(self) -> None:
        self.root._f32 = None

    def _shadow_slice(self) -> slice:
        return slice(self.offset // 2, (self.offset + self.nbytes) // 2)

    def f32(self, shape: tuple[int, ...]) -> np.ndarray:
        """Read-only f32 view of the bf16 contents (exact: every bf16 is an f32)."""
        root = self.root
        if root._f32 is None:
            root._f32 = root.raw[: root.nbytes - root.nbytes % 2].view(BF16).astype(np.float32)
        v = root._f32[self._shadow_slice()].reshape(shape)
        v.flags.writeable = False
        return v

    def bf16(self, shape: tuple[int, ...]) -> np.ndarray:
        return self.raw.view(BF16).reshape(shape)

    def array(self, shape: tuple[int, ...], dtype: str, shadow: bool = True) -> np.ndarray:
        """The contents as a kernel reads them: bf16 through the f32 shadow (or raw bf16), other element
        types as their own dtype (no copy)."""
        if dtype == "bf16":
            return self.f32(shape) if shadow else self.bf16(shape)
        return self.raw.view(_dtype(dtype).host).reshape(shape)

    def refresh_shadow(self) -> None:
        """Host bytes changed: update the root's shadow over this buffer's range (if one exists)."""
        root = self.root
        if root._f32 is not None:
            root._f32[self._shadow_slice()] = self.raw[: self.nbytes - self.nbytes % 2].view(BF16)

    def store(self, arr: np.ndarray, dtype: str = "bf16") -> None:
        """A kernel output: keep its bytes in this buffer's element type (bf16 rounded RNE, as the NPU
        stores results) and keep the shadow current."""
        a = np.asarray(arr)
        if dtype != "bf16":
            dt = _dtype(dtype).host
            if a.size * dt.itemsize != self.nbytes:
                raise ValueError(f"kernel output of {a.size * dt.itemsize} bytes for a buffer of {self.nbytes} bytes")
            np.copyto(self.raw.view(dt), a.reshape(-1).astype(dt, copy=False))
            return
        if a.dtype != BF16:
            a = a.astype(np.float32).astype(BF16)  # RNE
        if a.size * 2 != self.nbytes:
            raise ValueError(f"kernel output of {a.size * 2} bytes for a buffer of {self.nbytes} bytes")
        np.copyto(self.raw.view(BF16), a.reshape(-1))  # reshape copies only if `a` is not contiguous
        root = self.root
        if root._f32 is not None:
            root._f32[self._shadow_slice()] = a.reshape(-1)


class _Loaded:
    __slots__ = ("name", "program", "shapes", "dtypes")

    def __init__(self, name, program):
        self.name = name
        self.program = program
        self.shapes = tuple(tuple(s) for s in program.arg_shapes)
        self.dtypes = tuple(program.arg_dtypes) or ("bf16",) * len(self.shapes)


_CONTROLLER = False  # threadpoolctl.ThreadpoolController, created on first use (None if unavailable)


def _blas_controller():
    global _CONTROLLER
    if _CONTROLLER is False:
        try:
            from threadpoolctl import ThreadpoolController
            _CONTROLLER = ThreadpoolController()
        except Exception:  # optional dependency
            _CONTROLLER = None
    return _CONTROLLER


class _BlasThreads:
    """Context manager: BLAS libraries at `n` threads inside, previous counts restored on exit.
    Talks to the libraries' own get/set calls (threadpoolctl's lib controllers, selected once):
    threadpoolctl's limit() re-inspects every library on each entry, ~20 us per dispatch."""

    def __init__(self, controller, n: int):
        self.libs = list(controller.select(user_api="blas").lib_controllers)
        self.n = n
        self.saved: list = []

    def __enter__(self):
        self.saved = [lib.get_num_threads() for lib in self.libs]
        for lib, old in zip(self.libs, self.saved):
            if old is not None and old != self.n:
                lib.set_num_threads(self.n)
        return self

    def __exit__(self, *exc):
        for lib, old in zip(self.libs, self.saved):
            if old is not None and old != self.n:
                lib.set_num_threads(old)
        return False


class EmuDevice(Device):
    name = "emu"

    def __init__(self, executor=None, shadow_f32: bool = True, blas_threads: int | None = 1):
        """executor: anything with execute(launch, operands) -> ndarray (LaunchExecutor protocol).
        blas_threads: BLAS threads during a run (None = leave alone). Decode GEMVs are memory bound;
        multi-threaded OpenBLAS on a busy 2-core machine made them 5-10x slower, so runs use 1. Prefill-sized
        work uses the cores through kernel_builder.host_threads instead (attention items, GEMM row blocks)."""
        if executor is None:
            from multi_launch_builder.emulator.launch_program import ReferenceExecutor
            executor = ReferenceExecutor()
        self.executor = executor
        self.shadow_f32 = shadow_f32
        self.blas_threads = blas_threads
        ctl = _blas_controller() if blas_threads is not None else None
        self._blas = _BlasThreads(ctl, blas_threads) if ctl is not None else None
        self.stats = DeviceStats()

    def load(self, artifact: Artifact) -> _Loaded:
        from multi_launch_builder.emulator.launch_program import read_launch_program
        text = Path(artifact.mlir).read_text()
        try:
            program = read_launch_program(text)
        except ValueError as e:
            raise ValueError(f"module {artifact.name}: cannot read its launch program from "
                             f"{artifact.mlir}: {e}") from e
        self.stats.loads += 1
        return _Loaded(artifact.name, program)

    def alloc(self, nbytes: int) -> EmuBuffer:
        self.stats.on_alloc(nbytes)
        return EmuBuffer(nbytes)

    def free(self, buf: Buffer) -> None:
        self.stats.on_free(buf.nbytes)

    def view(self, buf: EmuBuffer, offset: int, nbytes: int) -> EmuBuffer:
        check_view(buf, offset, nbytes)
        return EmuBuffer(nbytes, buf.root, buf.offset + offset)

    def copy(self, dst: EmuBuffer, src: EmuBuffer, nbytes: int) -> None:
        np.copyto(dst.raw[:nbytes], src.raw[:nbytes])
        dst.refresh_shadow()

    def write(self, buf: EmuBuffer, data: np.ndarray) -> None:
        raw = check_nbytes(buf, data)
        np.copyto(buf.raw, raw)
        buf.refresh_shadow()
        self.stats.bytes_written += buf.nbytes

    def fill(self, buf: EmuBuffer, writer) -> None:
        writer(buf.raw)
        buf.refresh_shadow()
        self.stats.bytes_written += buf.nbytes

    def read(self, buf: EmuBuffer, shape, dtype) -> np.ndarray:
        dt = check_read(buf, shape, dtype)
        self.stats.bytes_read += buf.nbytes
        return buf.raw.copy().view(dt).reshape(shape)

    def run(self, handle: _Loaded, buffers: list[Buffer]) -> None:
        from multi_launch_builder.emulator.launch_program import run_program_io
        shapes, dtypes, shadow = handle.shapes, handle.dtypes, self.shadow_f32
        if len(buffers) != len(shapes):
            raise DeviceRunError(f"module {handle.name}: {len(buffers)} buffers for "
                                 f"{len(shapes)} arguments")

        def get(i, raw=False):
            a = buffers[i].array(shapes[i], dtypes[i], shadow and not raw)
            if raw:                       # kernels read their inputs: the stored bytes are not theirs to write
                a = a.view()
                a.flags.writeable = False
            return a

        def put(i, value):
            buffers[i].store(value, dtypes[i])

        limit = self._blas if self._blas is not None else contextlib.nullcontext()
        try:
            with limit:
                run_program_io(handle.program, get, put, self.executor)
        except DeviceRunError:
            raise
        except Exception as e:  # name the module; keep the original as cause
            raise DeviceRunError(f"module {handle.name}: emulated run failed: "
                                 f"{type(e).__name__}: {e}") from e
        self.stats.runs += 1
