"""The declaration format of a multi-launch module, shared by the stitcher, the build driver, the
ModuleExecutor, the devices and the model layer that derives the declarations.

A module is declared once: its combined signature (each argument with a role and an element type), the
per-call integer scalars it takes, its ordered launches with their wiring, and its aircc preset. Index sets
are always derived from here, never re-typed. Which arguments a launch writes comes from its kernel's
signature (kernel_builder.registry.SIGNATURES), not from the declaration.

Roles (docs/architecture.md, "Contracts"):
  INPUT         host writes it on every call (or binds another module's buffer with ModuleExecutor.ref)
  STATIC        written once per bo_key (weights, tables); shared by the modules of one family
  STATE         a window of a persistent device buffer (per bo_key, e.g. a layer's KV cache) that kernels
                read and write in place; the window starts at the row named by a scalar (`at`)
  SCALAR        an i32 value passed per call (position, valid length), on the device as memref<1xi32>
  INTERMEDIATE  produced and consumed on the device within the call; never transferred
  OUTPUT        produced on the device; the host reads it after the call (or a later call refs it)
"""
from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field
from typing import Callable

from kernel_builder.dtypes import dtype as _dtype
from kernel_builder.presets import AirccPreset


class Role(str, enum.Enum):
    INPUT = "input"
    STATIC = "static"
    STATE = "state"
    SCALAR = "scalar"
    INTERMEDIATE = "intermediate"
    OUTPUT = "output"


@dataclass(frozen=True)
class Arg:
    """One argument of a module's combined signature.

    STATE arguments name the persistent buffer they are a window of (`state`, default: the argument's
    name) and the scalar holding the window's first row (`at`, "" = row 0). The window's shape is `shape`;
    its rows have the shape `shape[1:]`, which every window of that state must share.

    A module spanning several buffer sets (the one-dispatch decode token: every layer's weights and KV cache)
    names, per STATIC or STATE argument, the `bo_key` whose buffer it binds (default: the call's), and per
    STATIC argument which other static it is (`shares` = (module family, argument name)): the same device
    buffer, written once."""

    name: str
    shape: tuple[int, ...]
    role: Role
    dtype: str = "bf16"
    state: str = ""
    at: str | int = ""      # the scalar naming the window's first row, or a constant row
    bo_key: str = ""
    shares: tuple[str, str] | tuple = ()

    def __post_init__(self) -> None:
        _dtype(self.dtype)  # ValueError for an unknown element type
        if any(not isinstance(d, int) or d <= 0 for d in self.shape):
            raise ValueError(f"argument {self.name}: shape {self.shape} must be positive ints")
        if self.role is not Role.STATE and (self.state or self.at):
            raise ValueError(f"argument {self.name}: state=/at= are for STATE arguments only")
        if self.role not in (Role.STATE, Role.STATIC) and self.bo_key:
            raise ValueError(f"argument {self.name}: bo_key= is for STATE and STATIC arguments only")
        if self.shares and (self.role is not Role.STATIC or len(self.shares) != 2):
            raise ValueError(f"argument {self.name}: shares= is (family, name) of a STATIC argument")
        if self.role is Role.SCALAR and (self.dtype != "i32" or self.shape != (1,)):
            raise ValueError(f"argument {self.name}: a SCALAR is one i32 (shape (1,), dtype i32)")

    @property
    def state_name(self) -> str:
        return self.state or self.name

    @property
    def nbytes(self) -> int:
        return _dtype(self.dtype).nbytes(self.shape)

    @property
    def row_nbytes(self) -> int:
        """Bytes of one leading-dimension row (the unit a STATE window offset counts in)."""
        return _dtype(self.dtype).nbytes(self.shape[1:]) if len(self.shape) > 1 else _dtype(self.dtype).bits // 8

    @property
    def memref_type(self) -> str:
        return "memref<" + "x".join(str(d) for d in self.shape) + f"x{_dtype(self.dtype).mlir}>"

    @property
    def elements(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True)
class Launch:
    """One sub-kernel: `build()` returns its single-kernel module text; `wiring` lists, in the kernel's
    canonical argument order, the combined-signature argument names it binds to."""

    prefix: str
    build: Callable[[], str] = field(compare=False, repr=False)
    wiring: tuple[str, ...]


@dataclass(frozen=True)
class ModuleDecl:
    name: str
    args: tuple[Arg, ...]
    launches: tuple[Launch, ...]
    # Modules of one family (the same kernels at different prefill lengths) share static buffers per
    # bo_key when an argument's name, shape and dtype agree. Empty = the module is its own family.
    family: str = ""
    # Per-call integer operands, by name: SCALAR arguments and the `at` of STATE windows.
    scalars: tuple[str, ...] = ()
    # aircc options; None (what the model layer declares): the build derives them from the kernels, aircc_preset()
    preset: AirccPreset | None = None

    @property
    def static_group(self) -> str:
        return self.family or self.name

    def __post_init__(self) -> None:
        names = [a.name for a in self.args]
        dup = {n for n in names if names.count(n) > 1}
        if dup:
            raise ValueError(f"module {self.name}: duplicate argument names {sorted(dup)}")
        scalars = set(self.scalars)
        for a in self.args:
            if a.role is Role.SCALAR and a.name not in scalars:
                raise ValueError(f"module {self.name}: SCALAR argument {a.name!r} is not in scalars={self.scalars}")
            if a.role is Role.STATE and isinstance(a.at, str) and a.at and a.at not in scalars:
                raise ValueError(f"module {self.name}: STATE argument {a.name!r} starts at scalar {a.at!r}, "
                                 f"which is not in scalars={self.scalars}")

    def aircc_preset(self) -> AirccPreset:
        """The declared preset; without one, the one the NPU2 hardware model derives from the module's kernels
        (kernel_builder.hw.tune.preset_for_kernels): the stack their core code needs (RMSNorm's soft-float invsqrt
        needs 1152 bytes, rounded up to `--stack-size 1280`; without an RMSNorm aircc's default 1024 stays) and
        the runtime loop tiling their launch grids need to keep the shim BDs in budget (the coarsest of 2,2 / 1,2
        / 2,1 / 1,1 under which the model counts no overflow; none when the grid fits untiled). The stitcher and
        the build driver ask this when they generate the module's text, so declaring a module (the model
        layer's plans, the memory check, `llama-npu doctor`) generates no MLIR. Kernels the hardware model cannot
        read (hand-written test modules) get aircc's defaults; the build's hardware gate reports them."""
        if self.preset is not None:
            return self.preset
        from kernel_builder.hw.ir import HwParseError
        from kernel_builder.hw.tune import preset_for_kernels
        try:
            return preset_for_kernels([launch.build() for launch in self.launches])
        except HwParseError:
            return AirccPreset()

    def index(self, name: str) -> int:
        for i, a in enumerate(self.args):
            if a.name == name:
                return i
        raise KeyError(f"module {self.name} has no argument {name!r}")

    def arg(self, name: str) -> Arg:
        return self.args[self.index(name)]

    def indices(self, *roles: Role) -> tuple[int, ...]:
        return tuple(i for i, a in enumerate(self.args) if a.role in roles)

    def names(self, *roles: Role) -> tuple[str, ...]:
        return tuple(self.args[i].name for i in self.indices(*roles))

    def states(self) -> dict[str, Arg]:
        """Persistent buffers this module uses: state name -> one of its window arguments."""
        out: dict[str, Arg] = {}
        for a in self.args:
            if a.role is Role.STATE:
                out.setdefault(a.state_name, a)
        return out
