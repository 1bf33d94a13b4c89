"""The external C++ kernel families (external_kernels/*.cc) as the layers see them: ExternalFamily, one row per
.cc source (kernel_builder/<kind>/external.py defines it and the kernel's SPEC registers it), the lookups by
object and symbol name over every registered family, and the shape checks the families share.

Each ExternalKernel (external_kernels.compile_rules) names one `extern "C"` symbol inside one object file. One
.cc source is compiled several times with different -D shape flags; every shape gets its own symbol and object
name (e.g. `mv_bf16_k2048_c2048_m4_r256` in `mv_k2048_c2048_m4_r256.o` next to `mv_bf16_k8192_c1024_m8_r256`
in `mv_k8192_c1024_m8_r256.o`), so variants can be linked into one multi-launch module without clashing.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable

from external_kernels.compile_rules import ExternalKernel


def check_multiple(kernel: str, name: str, value: int, multiple: int) -> None:
    if value % multiple:
        raise ValueError(
            f"{kernel}: {name}={value} must be a multiple of {multiple} (AIE2P vector width of the kernel)")


# ---------------------------------------------------------------------------------------------- families
@dataclass(frozen=True)
class ExternalFamily:
    """Everything the layers need to know about one .cc source, in one row: how its object files and
    symbols are named (regexes whose groups are the shape parameters), how to rebuild the ExternalKernel
    from an object name (build driver), and which numpy model the interpreter runs for a symbol
    (called with the symbol's regex groups, ints where numeric)."""

    name: str
    source: str
    object_re: str
    symbol_re: str
    from_object: Callable[..., ExternalKernel]
    model: Callable[..., Callable]


def elementwise_kernel(kind: str, n: int, multiple: int) -> ExternalKernel:
    """The frame the elementwise .cc sources share (add.cc, swiglu.cc, geglu.cc): one bf16 n-vector kernel,
    symbol `<kind>_bf16_n<N>` in `<kind>_n<N>.o`, shape and symbol from -D <KIND>_N and <KIND>_SYMBOL."""
    from kernel_builder.planner import check_positive

    check_positive(kind, n=n)
    check_multiple(kind, "n", n, multiple)
    symbol = f"{kind}_bf16_n{n}"
    up = kind.upper()
    return ExternalKernel(symbol=symbol, obj=f"{kind}_n{n}.o", source=f"{kind}.cc",
                          defines=((f"{up}_N", str(n)), (f"{up}_SYMBOL", symbol)))


def elementwise_family(kind: str, kernel: Callable[[int], ExternalKernel], model: Callable) -> ExternalFamily:
    """The ExternalFamily of an elementwise kernel named as `elementwise_kernel` names it."""
    return ExternalFamily(kind, f"{kind}.cc", rf"{kind}_n(\d+)\.o", rf"{kind}_bf16_n(\d+)", kernel, model)


def _ints(groups) -> list:
    return [int(g) if g is not None and g.isdigit() else g for g in groups]


def families() -> tuple[ExternalFamily, ...]:
    """Every registered kernel's external families (kernel_builder.registry)."""
    from kernel_builder.registry import specs
    return tuple(f for sp in specs() for f in sp.families)


def kernel_for_object(obj: str) -> ExternalKernel | None:
    """The kernel whose compile produces `obj` (a `link_with` name), or None if no family makes it.

    For an object holding several symbols (attention) this returns its first entry; all share one compile.
    """
    for fam in families():
        match = re.fullmatch(fam.object_re, obj)
        if match:
            kernel = fam.from_object(*_ints(match.groups()))
            return kernel if kernel.obj == obj else None  # e.g. "mv_k08_m2.o" is not ours
    return None


def family_of_symbol(symbol: str) -> tuple[ExternalFamily, list] | None:
    """(family, shape parameters) of an external symbol, or None."""
    for fam in families():
        match = re.fullmatch(fam.symbol_re, symbol)
        if match:
            return fam, _ints(match.groups())
    return None


def external_model(symbol: str):
    """The numpy model (emu-interp) of an external symbol, or None when no family names it."""
    found = family_of_symbol(symbol)
    if found is None:
        return None
    fam, params = found
    return fam.model(*params)


