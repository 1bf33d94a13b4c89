"""What one kernel is, for the layers that use it: its canonical signature (KernelSig) and its parts
(KernelSpec: builder, numpy reference, external C++ families and their cost descriptors). Each kernel package
(kernel_builder/<kind>/__init__.py) defines one `SPEC`; kernel_builder.registry lists the packages."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable


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


@dataclass(frozen=True)
class KernelSpec:
    """One kernel, registered once: `build(*shape) -> MLIR text` (its builder), `reference(*inputs, **params)`
    (numpy, NPU numerics), the external C++ families it calls (kernel_builder.externals.ExternalFamily: object
    and symbol names, the interpreter's model) and their cost descriptors for the hardware model
    (kernel_builder.external_costs.ExternalCost)."""

    sig: KernelSig
    build: Callable[..., str]
    reference: Callable
    families: tuple = ()
    costs: tuple = ()

    @property
    def kind(self) -> str:
        return self.sig.kind
