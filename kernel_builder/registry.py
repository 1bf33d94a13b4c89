"""The registered kernels (one package per kind: kernel_builder/<kind>/) and their canonical signatures.

`SIGNATURES[kind]` names each kernel's canonical arguments (the order of its module's function arguments
and of a Launch's wiring) and which of them the kernel writes; `inplace` ones are read and written (e.g.
a running softmax state). The stitcher checks data flow with it, the launch program (emu) knows which
operands a launch produces, and the ModuleExecutor's alias/hazard check knows what each launch touches.

`kernel_text(kind, *args, **kwargs)` is the memoised entry point to the builders: identical (kind, shape)
kernels are generated once per process.
"""
from __future__ import annotations

import functools
import importlib

from kernel_builder.spec import KernelSig, KernelSpec


# The registration: one line per kernel package kernel_builder/<kind>/ (its __init__ defines SPEC).
KINDS: tuple[str, ...] = ("rmsnorm", "gemm", "gemv", "rope", "swiglu", "attention", "add", "gemv_q4",
                         "bias_add", "geglu", "dequant_q4", "topk", "gemm_swiglu", "gemm_bias", "gemv_bias",
                         "gemv_q4_bias", "gemm_q4", "kv_quant", "attention_kv8", "kv_dequant",
                         "gemv_q4_swiglu", "gemm_bfp", "gemm_bfp_bias", "gemv_bfp", "gemv_bfp_bias")


def spec(kind: str) -> KernelSpec:
    """The registered kernel `kind` (KeyError naming the known kinds when it is not one)."""
    if kind not in KINDS:
        raise KeyError(f"unknown kernel {kind!r} (registered: {', '.join(KINDS)})")
    return importlib.import_module(f"kernel_builder.{kind}").SPEC


def specs() -> tuple[KernelSpec, ...]:
    return tuple(spec(k) for k in KINDS)


SIGNATURES: dict[str, KernelSig] = {s.kind: s.sig for s in specs()}


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
    """The registered builder of `kind` (`kernel_builder.<kind>.builder.build`) on these arguments, cached."""
    return spec(kind).build(*args, **kwargs)


def kernel(kind: str, *args, **kwargs):
    """A zero-argument factory for Launch.build."""
    return functools.partial(kernel_text, kind, *args, **kwargs)


def clear_kernel_cache() -> None:
    kernel_text.cache_clear()
