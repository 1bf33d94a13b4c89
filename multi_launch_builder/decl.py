"""The declaration format shared by the stitcher, the build driver, the KernelCache and the runtime.

A multi-launch module is declared once: its combined signature (each argument with a role) and its
ordered launches with their wiring. Index sets are always derived from here, never re-typed.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Callable


class Role(str, enum.Enum):
    INPUT = "input"                # host writes it on every call
    STATIC = "static"              # written once per bo_key (weights, prefill RoPE LUT)
    INTERMEDIATE = "intermediate"  # produced and consumed on the device; never transferred
    OUTPUT = "output"              # produced on the device; host reads it after every call


@dataclass(frozen=True)
class Arg:
    name: str
    shape: tuple[int, ...]
    role: Role
    dtype: str = "bf16"

    @property
    def nbytes(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n * 2  # bf16 everywhere on the device

    @property
    def memref_type(self) -> str:
        return "memref<" + "x".join(str(d) for d in self.shape) + f"x{self.dtype}>"


@dataclass(frozen=True)
class Launch:
    """One sub-kernel: `build()` returns its single-kernel module text; `wiring` lists, in the
    kernel's canonical argument order, the combined-signature argument names it binds to."""

    prefix: str
    build: Callable[[], str] = field(compare=False, repr=False)
    wiring: tuple[str, ...]


@dataclass(frozen=True)
class ModuleDecl:
    name: str
    args: tuple[Arg, ...]
    launches: tuple[Launch, ...]
    # Modules of one family (the same kernels at different prefill lengths) share static buffers
    # per bo_key when an argument's name, shape and dtype agree: weights are resident once per layer,
    # not once per bucket. Empty = the module is its own family.
    family: str = ""

    @property
    def static_group(self) -> str:
        return self.family or self.name

    def __post_init__(self) -> None:
        names = [a.name for a in self.args]
        dup = {n for n in names if names.count(n) > 1}
        if dup:
            raise ValueError(f"module {self.name}: duplicate argument names {sorted(dup)}")

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
