"""The kernel builders (one module per kind) and their canonical signatures.

`SIGNATURES[kind]` names each kernel's canonical arguments (the order of its module's function arguments
and of a Launch's wiring) and which of them the kernel writes; `inplace` ones are read and written (e.g.
a running softmax state). The stitcher checks data flow with it, the launch program (emu) knows which
operands a launch produces, and the KernelCache's alias/hazard check knows what each launch touches.

`kernel_text(kind, *args, **kwargs)` is the memoised entry point to the builders: identical (kind, shape)
kernels are generated once per process.
"""
from __future__ import annotations

import functools
import importlib
from dataclasses import dataclass


@dataclass(frozen=True)
class KernelSig:
    kind: str
    args: tuple[str, ...]
    writes: tuple[str, ...] = ()      # written (pure outputs); default: the last argument
    inplace: tuple[str, ...] = ()     # read and written

    def __post_init__(self) -> None:
        if not self.writes and not self.inplace:
            object.__setattr__(self, "writes", self.args[-1:])
        bad = (set(self.writes) | set(self.inplace)) - set(self.args)
        if bad:
            raise ValueError(f"kernel {self.kind}: unknown written arguments {sorted(bad)}")

    @property
    def written(self) -> tuple[int, ...]:
        """Canonical positions the kernel writes (outputs and in-place)."""
        return tuple(i for i, a in enumerate(self.args) if a in self.writes or a in self.inplace)

    @property
    def read(self) -> tuple[int, ...]:
        """Canonical positions the kernel reads (inputs and in-place)."""
        return tuple(i for i, a in enumerate(self.args) if a not in self.writes)


SIGNATURES: dict[str, KernelSig] = {s.kind: s for s in (
    KernelSig("rmsnorm", ("x", "w", "y")),
    KernelSig("gemm", ("a", "w", "c")),
    KernelSig("gemv", ("w", "x", "y")),
    KernelSig("rope", ("x", "lut", "y")),
    KernelSig("swiglu", ("gate", "up", "y")),
    KernelSig("attention", ("q", "k", "v", "pos", "o")),
    KernelSig("add", ("a", "b", "y")),
)}


def signature(kind: str, arity: int | None = None) -> KernelSig:
    """The kind's signature; an unknown kind (a hand-written test kernel) writes its last argument."""
    sig = SIGNATURES.get(kind)
    if sig is None:
        n = arity or 1
        sig = KernelSig(kind, tuple(f"arg{i}" for i in range(n)))
    elif arity is not None and arity != len(sig.args):
        raise ValueError(f"kernel {kind}: {arity} arguments, its signature has {len(sig.args)} "
                         f"({', '.join(sig.args)})")
    return sig


@functools.lru_cache(maxsize=None)
def kernel_text(kind: str, *args, **kwargs) -> str:
    """`kernel_builder.<kind>.builder.build(*args, **kwargs)`, cached."""
    return importlib.import_module(f"kernel_builder.{kind}.builder").build(*args, **kwargs)


def kernel(kind: str, *args, **kwargs):
    """A zero-argument factory for Launch.build."""
    return functools.partial(kernel_text, kind, *args, **kwargs)


def clear_kernel_cache() -> None:
    kernel_text.cache_clear()
