"""`emu-interp`: the software NPU that executes the AIR text itself (multi_launch_builder.emulator.air_interp).

Same buffers, byte counters and write/read contract as `emu` (it is an EmuDevice); only load() and run()
differ: load() compiles the module text into an interpretable program (herds, L1 buffers, DMA patterns,
external-kernel calls), run() executes it in place on the buffers' bf16 bytes. Slower than `emu`, but a
tiling bug (wrong DMA offset/size/stride, herd tile over the wrong rows, wrong loop bound) changes its results.
"""
from __future__ import annotations

from pathlib import Path

from multi_launch_builder.emulator import air_interp
from .base import Artifact, Buffer, DeviceRunError
from .emu import EmuDevice


class InterpHandle:
    __slots__ = ("name", "program", "shapes", "interp")

    def __init__(self, name, program, interp):
        self.name = name
        self.program = program          # the LaunchProgram (read by emu's parser: validates wiring too)
        self.shapes = tuple(tuple(s) for s in program.arg_shapes)
        self.interp = interp            # air_interp.Program


class InterpEmuDevice(EmuDevice):
    name = "emu-interp"

    def __init__(self, **kwargs):
        kwargs.pop("executor", None)  # numerics come from the text, not from an executor
        super().__init__(**kwargs)
        self.last_run_stats: air_interp.Stats | None = None

    def load(self, artifact: Artifact) -> InterpHandle:
        base = super().load(artifact)
        text = Path(artifact.mlir).read_text()
        try:
            interp = air_interp.compile_module(text)
        except ValueError as e:
            raise ValueError(f"module {artifact.name}: cannot interpret {artifact.mlir}: {e}") from e
        return InterpHandle(artifact.name, base.program, interp)

    def run(self, handle: InterpHandle, buffers: list[Buffer]) -> None:
        prog = handle.interp
        if len(buffers) != len(prog.arg_types):
            raise DeviceRunError(f"module {handle.name}: {len(buffers)} buffers for "
                                 f"{len(prog.arg_types)} arguments")
        try:
            arrays = []
            for i, (buf, t) in enumerate(zip(buffers, prog.arg_types)):
                dt = air_interp.DTYPES[t.dtype]
                if buf.nbytes != t.size * dt.itemsize:
                    raise DeviceRunError(f"module {handle.name}: buffer {i} has {buf.nbytes} bytes, argument "
                                         f"{prog.arg_names[i]} needs {t.size * dt.itemsize}")
                arrays.append(buf.raw.view(dt))  # in place: DMAs into an argument write the buffer's bytes
            _, stats = prog.run_memrefs(prog.wrap(arrays))
        except DeviceRunError:
            raise
        except Exception as e:
            raise DeviceRunError(f"module {handle.name}: interpreted run failed: {type(e).__name__}: {e}") from e
        finally:
            for buf in buffers:  # any f32 shadow may be stale now
                buf.invalidate()
        self.last_run_stats = stats
        self.stats.runs += 1
