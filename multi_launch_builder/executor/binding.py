"""What one ModuleExecutor call binds to each argument slot, checked before anything reaches the device: host
arrays (shape and dtype), scalars (ints that fit an i32), refs to another module's buffer (`DeviceRef`: size,
dtype, role and "has run" checked) and the aliasing a ref can create between two slots of one call
(docs/cache.md, "Device-side hand-off" and "Aliasing rule")."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable

import numpy as np

from ..decl import Arg, ModuleDecl, Role
from ..devices.base import Buffer
from kernel_builder.dtypes import dtype as _dtype


def numpy_dtype(arg: Arg) -> np.dtype:
    """Host dtype of an argument's array (bf16 -> ml_dtypes.bfloat16, i4 -> packed uint8)."""
    return _dtype(arg.dtype).host


def host_shape(arg: Arg) -> tuple[int, ...]:
    return _dtype(arg.dtype).host_shape(arg.shape)


@dataclass(frozen=True)
class DeviceRef:
    """An INPUT value meaning "the device buffer `module.arg` used in that module's last call"
    (made by ModuleExecutor.ref), or with `row`, the part of it starting at that leading-dimension row.
    Its contents are whatever the device holds there when the call runs."""

    module: str
    arg: str
    row: int | None = None


def check_value(decl: ModuleDecl, arg: Arg, dt: np.dtype, value) -> np.ndarray:
    if not isinstance(value, np.ndarray):
        raise ValueError(f"module {decl.name} arg {arg.name}: expected a numpy array, got {type(value).__name__}")
    if value.dtype != dt:
        raise ValueError(f"module {decl.name} arg {arg.name}: dtype {value.dtype}, expected {arg.dtype}")
    if value.shape != host_shape(arg):
        raise ValueError(f"module {decl.name} arg {arg.name}: shape {value.shape}, expected {host_shape(arg)}")
    return value


def bind_args(decl: ModuleDecl, rows: tuple, index: dict[str, int], args: tuple,
              named: dict) -> tuple[list, dict[str, int]]:
    """Positional and named values in declaration order (None where not given), and the scalars by name."""
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


def resolve_ref(decl: ModuleDecl, arg: Arg, ref: DeviceRef, src_rows: tuple, src_index: dict[str, int],
                bound: dict[str, list[Buffer]], view: Callable[[Buffer, int, int], Buffer]) -> Buffer:
    """The buffer a ref points at, after checking it can stand in for `arg` (size and dtype). `src_rows` /
    `src_index` describe the referenced module's arguments, `bound` holds each module's last buffer list."""
    i = src_index.get(ref.arg)
    if i is None:
        raise ValueError(f"module {decl.name} arg {arg.name}: ref to unknown argument {ref.module}.{ref.arg}")
    sarg, _, srole = src_rows[i]
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
    bufs = bound.get(ref.module)
    if bufs is None:
        raise ValueError(f"module {decl.name} arg {arg.name}: ref to {ref.module}.{ref.arg}, but "
                         f"{ref.module} has not run yet (its buffer holds nothing)")
    if ref.row is None:
        return bufs[i]
    return view(bufs[i], offset, arg.nbytes)


def _extent(b: Buffer) -> tuple[int, int, int]:
    root = getattr(b, "root", None)
    if root is not None and root is not b:
        return id(root), b.offset, b.offset + b.nbytes
    return id(b), 0, b.nbytes


def check_alias_hazard(decl: ModuleDecl, bufs: list[Buffer], refs: Iterable[int], program,
                       safe_patterns: set[tuple]) -> None:
    """Two slots of one call on overlapping memory are safe only if no launch reads one of them after
    another launch of the run has written the other (launches run in order, on the NPU as on emu).
    Only a ref can make a slot overlap another (windows of one state may overlap each other: reading what
    an earlier launch wrote there is their purpose), so only the ref'd slots are compared. `program()` gives
    the module's LaunchProgram; overlap patterns found safe are remembered in `safe_patterns`."""
    others = [j for j, a in enumerate(decl.args) if a.role is not Role.STATE]   # refs never reach states
    ext = {j: _extent(bufs[j]) for j in others}
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
    if pattern in safe_patterns:
        return
    written: set[int] = set()
    names = [a.name for a in decl.args]
    for n, launch in enumerate(program().launches):
        for i in launch.read_args:
            clobbered = overlap.get(i, set()) & written
            if clobbered:
                raise ValueError(f"module {decl.name}: arg {names[i]} aliases {names[min(clobbered)]}, which "
                                 f"launch order overwrites before launch {n} ({launch.kind}) reads it")
        written.update(o for o in launch.written_args if o in overlap)
    safe_patterns.add(pattern)
