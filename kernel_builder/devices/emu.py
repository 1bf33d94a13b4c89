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

from ..numerics import BF16
from .base import Artifact, Buffer, Device, DeviceRunError, DeviceStats, check_nbytes, check_read


class EmuBuffer(Buffer):
    __slots__ = ("nbytes", "raw", "_f32", "_views")

    def __init__(self, nbytes: int):
        self.nbytes = nbytes
        self.raw = np.zeros(nbytes, dtype=np.uint8)
        self._f32: np.ndarray | None = None
        self._views: dict[tuple, np.ndarray] = {}

    def invalidate(self) -> None:
        self._f32 = None
        self._views.clear()

    def f32(self, shape: tuple[int, ...]) -> np.ndarray:
        """Read-only f32 view of the bf16 contents (exact: every bf16 is an f32)."""
        v = self._views.get(shape)
        if v is None:
            if self._f32 is None:
                self._f32 = self.raw.view(BF16).astype(np.float32)
                self._f32.flags.writeable = False
            v = self._f32.reshape(shape)
            self._views[shape] = v
        return v

    def bf16(self, shape: tuple[int, ...]) -> np.ndarray:
        return self.raw.view(BF16).reshape(shape)

    def store(self, arr: np.ndarray) -> None:
        """A kernel output: keep the bf16 bytes; the shadow is rebuilt on the next read."""
        a = np.asarray(arr)
        if a.dtype != BF16:
            a = a.astype(np.float32).astype(BF16)  # RNE, as the NPU stores results
        if a.size * 2 != self.nbytes:
            raise ValueError(f"kernel output of {a.size * 2} bytes for a buffer of {self.nbytes} bytes")
        np.copyto(self.raw.view(BF16), a.reshape(-1))  # reshape copies only if `a` is not contiguous
        self._f32 = None
        if self._views:
            self._views.clear()


class _Loaded:
    __slots__ = ("name", "program", "shapes")

    def __init__(self, name, program):
        self.name = name
        self.program = program
        self.shapes = tuple(tuple(s) for s in program.arg_shapes)


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
        multi-threaded OpenBLAS on a busy 2-core machine made them 5-10x slower, so runs use 1."""
        if executor is None:
            from ..launch_program import ReferenceExecutor
            executor = ReferenceExecutor()
        self.executor = executor
        self.shadow_f32 = shadow_f32
        self.blas_threads = blas_threads
        ctl = _blas_controller() if blas_threads is not None else None
        self._blas = _BlasThreads(ctl, blas_threads) if ctl is not None else None
        self.stats = DeviceStats()

    def load(self, artifact: Artifact) -> _Loaded:
        from ..launch_program import read_launch_program
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

    def write(self, buf: EmuBuffer, data: np.ndarray) -> None:
        raw = check_nbytes(buf, data)
        np.copyto(buf.raw, raw)
        buf.invalidate()
        self.stats.bytes_written += buf.nbytes

    def read(self, buf: EmuBuffer, shape, dtype) -> np.ndarray:
        dt = check_read(buf, shape, dtype)
        self.stats.bytes_read += buf.nbytes
        return buf.raw.copy().view(dt).reshape(shape)

    def run(self, handle: _Loaded, buffers: list[Buffer]) -> None:
        from ..launch_program import run_program_io
        shapes = handle.shapes
        if len(buffers) != len(shapes):
            raise DeviceRunError(f"module {handle.name}: {len(buffers)} buffers for "
                                 f"{len(shapes)} arguments")
        if self.shadow_f32:
            def get(i):
                return buffers[i].f32(shapes[i])
        else:
            def get(i):
                return buffers[i].bf16(shapes[i])

        def put(i, value):
            buffers[i].store(value)

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
