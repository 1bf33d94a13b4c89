"""The launches of a (stitched) module, read from its MLIR text, and a launch-by-launch interpreter.

This is what the `emu` device executes. Everything comes FROM THE TEXT, never from the declaration that
produced it, so a wiring bug in a builder or in the stitcher changes what emu computes:

- the public func's name and signature -> `arg_shapes` (argument index -> memref shape);
- per top-level `air.launch`, in order: kind + params from `llama_npu.kernel = {kind = "...", ...}` and the
  operands of `args(%x=%argN, ...)` mapped to function-argument indices; which operands the launch writes
  comes from the kind's signature (kernel_builder.registry.SIGNATURES; default: the last one).

Read once (`read_launch_program`, from the one AIR reader's tree: kernel_builder.air_module) at load time;
`run_program` then only indexes lists.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import Callable, MutableSequence, Protocol

import numpy as np

from kernel_builder import air_module
from kernel_builder import mlir_text as mt
from kernel_builder.dtypes import from_mlir
from kernel_builder.registry import signature

KERNEL_ATTR = "llama_npu.kernel"


@dataclass(frozen=True)
class LaunchSpec:
    kind: str                    # kernel kind ("gemm", "rmsnorm", ...)
    params: dict = field(hash=False)  # the launch attribute without `kind` (rows=..., eps=...)
    operands: tuple[int, ...]    # function-argument index per canonical kernel argument
    writes: tuple[int, ...] = () # positions in `operands` the launch writes (outputs and in-place)
    reads: tuple[int, ...] = ()  # positions in `operands` the launch reads (inputs and in-place)

    def __post_init__(self) -> None:
        sig = signature(self.kind, len(self.operands))
        if not self.writes:
            object.__setattr__(self, "writes", sig.written)
        if not self.reads:
            object.__setattr__(self, "reads", sig.read)
        object.__setattr__(self, "written_args", tuple(self.operands[p] for p in self.writes))
        object.__setattr__(self, "read_args", tuple(self.operands[p] for p in self.reads))


@dataclass(frozen=True)
class LaunchProgram:
    name: str
    arg_shapes: tuple[tuple[int, ...], ...]
    launches: tuple[LaunchSpec, ...]
    arg_dtypes: tuple[str, ...] = ()     # declaration dtype names ("bf16", "f32", "i32", ...)

    @functools.cached_property
    def arg_sizes(self) -> tuple[int, ...]:
        """Element count per argument (computed once: run_program_io checks every launch result)."""
        return tuple(math.prod(s) for s in self.arg_shapes)


def read_launch_program(text: str) -> LaunchProgram:
    """Parse a module's text into its LaunchProgram. ValueError names the launch and operand at fault."""
    tree = air_module.read(text)
    func = tree.func
    where = f"func.func @{func.name}"
    index: dict[str, int] = {}
    shapes, dtypes = [], []
    for i, (name, type_text) in enumerate(func.params):
        if name is None:
            raise ValueError(f"{where}: argument {i} has no name")
        try:
            shape, elem = mt.memref_shape(type_text)
            dtypes.append(from_mlir(elem).name)
        except ValueError as e:
            raise ValueError(f"{where}: argument %{name}: {e}") from None
        index[name] = i
        shapes.append(shape)
    if not tree.body or tree.body[-1].name not in ("return", "func.return"):
        raise ValueError(f"func.func @{func.name}: body does not end with `return`")
    launches = []
    for op in tree.top_regions:   # air.launch, or a bare herd: an unstitched single-kernel module
        n = len(launches)
        air = op.air
        attr = air.attributes.get(KERNEL_ATTR)
        if not isinstance(attr, dict) or not isinstance(attr.get("kind"), str):
            raise ValueError(f"{where}: launch {n} has no `{KERNEL_ATTR} = {{kind = \"...\"}}` attribute")
        operands = []
        for inner, outer in air.args:
            if outer not in index:
                raise ValueError(f"{where}: launch {n} ({attr['kind']}) operand %{inner}=%{outer} is not a "
                                 "function argument")
            operands.append(index[outer])
        if not operands:
            raise ValueError(f"{where}: launch {n} ({attr['kind']}) has no operands")
        params = {k: v for k, v in attr.items() if k != "kind"}
        try:
            launches.append(LaunchSpec(attr["kind"], params, tuple(operands)))
        except ValueError as e:
            raise ValueError(f"{where}: launch {n}: {e}") from None
    if not launches:
        raise ValueError(f"{where}: no air.launch found")
    return LaunchProgram(func.name, tuple(shapes), tuple(launches), tuple(dtypes))


class LaunchExecutor(Protocol):
    def execute(self, launch: LaunchSpec, operands: list[np.ndarray]):
        """Compute one launch. `operands` are the arrays bound to launch.operands (written slots are passed
        too, for their shapes and, when in place, their contents); returns the new contents of the written
        operands: one array for a single write, else a tuple in `launch.writes` order."""


class ReferenceExecutor:
    """Executes launches with the numpy references (kernel_builder.reference.KERNELS)."""

    def __init__(self, kernels: dict | None = None):
        if kernels is None:
            from kernel_builder.reference import KERNELS as kernels  # noqa: N811
        self.kernels = kernels

    def raw_reads(self, launch: LaunchSpec) -> tuple[int, ...]:
        """Operand positions this launch takes in their stored element type (bf16) instead of the device's
        f32 shadow: a gemv's (gemv_bias's) weight when the host GEMV kernel is built (it reads bf16: half the
        bytes); a gemv_q4's (gemv_q4_bias's, gemv_q4_swiglu's two) packed 4-bit weights always (bytes, not
        numbers)."""
        if launch.kind in ("gemv_q4", "gemv_q4_bias"):
            return (launch.reads[0],)
        if launch.kind == "gemv_q4_swiglu":
            return tuple(launch.reads[:2])
        if launch.kind in ("gemv", "gemv_bias"):      # gemv_bias: a decode's residual add in its epilogue
            from external_kernels import host_build as host_native
            from kernel_builder import reference
            if self.kernels.get(launch.kind) is getattr(reference, launch.kind) and host_native.library() is not None:
                return (launch.reads[0],)
        return ()

    def execute(self, launch: LaunchSpec, operands: list[np.ndarray]):
        fn = self.kernels.get(launch.kind)
        if fn is None:
            raise ValueError(f"no reference for kernel kind {launch.kind!r}")
        return fn(*(operands[p] for p in launch.reads), **launch.params)


def run_program_io(program: LaunchProgram, get: Callable[..., np.ndarray],
                   put: Callable[[int, np.ndarray], None], executor: LaunchExecutor) -> None:
    """Run every launch in order. `get(i)` returns argument i's current data (`get(i, raw=True)`: in its
    stored element type, for the operands the executor's optional `raw_reads(launch)` names); `put(i, array)`
    stores a launch result (already reshaped to argument i's shape). The emulator wraps its own buffers (and
    any f32 shadow copies) in these two callables."""
    shapes, sizes = program.arg_shapes, program.arg_sizes
    raw_reads = getattr(executor, "raw_reads", None)
    for n, launch in enumerate(program.launches):
        raw = raw_reads(launch) if raw_reads is not None else ()
        operands = [get(i, raw=True) if p in raw else get(i) for p, i in enumerate(launch.operands)]
        result = executor.execute(launch, operands)
        outs = (result,) if len(launch.writes) == 1 else tuple(result)
        if len(outs) != len(launch.writes):
            raise ValueError(f"{program.name}: launch {n} ({launch.kind}) produced {len(outs)} results for "
                             f"{len(launch.writes)} written operands")
        for out_i, value in zip(launch.written_args, outs):
            value = np.asarray(value)
            if value.size != sizes[out_i]:
                raise ValueError(f"{program.name}: launch {n} ({launch.kind}) produced {value.shape} for "
                                 f"argument {out_i} of shape {shapes[out_i]}")
            put(out_i, value.reshape(shapes[out_i]))


def run_program(program: LaunchProgram, buffers: MutableSequence[np.ndarray], executor: LaunchExecutor) -> None:
    """Run on a list of per-argument arrays, in place: each launch's output slot is replaced by its result."""
    if len(buffers) != len(program.arg_shapes):
        raise ValueError(f"{program.name}: {len(buffers)} buffers for {len(program.arg_shapes)} arguments")

    def put(i: int, a: np.ndarray) -> None:
        buffers[i] = a

    run_program_io(program, lambda i, raw=False: buffers[i], put, executor)
