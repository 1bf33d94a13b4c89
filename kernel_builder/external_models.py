"""numpy models of the external C++ kernels' scalar paths, used by the interpreting emulator (emu-interp).

Each model mirrors `external_kernels/<family>.cc`'s portable path (f32 math in the same
order, one RNE bf16 store), so the interpreter gives what a host-compiled kernel gives. Arguments are the
interpreter's MemRefs (`.data`: a flat array, `.dtype`: element type name, `.written`). Each kernel's model
is in kernel_builder/<kind>/external.py (its family row names it); this module holds what they share.
"""
from __future__ import annotations

import numpy as np


F32 = np.float32


class ModelError(ValueError):
    """A call whose arguments do not match the kernel (the interpreter names the call site)."""


def need_memref(mr, name: str, size: int, dtype: str = "bf16") -> np.ndarray:
    if not hasattr(mr, "data"):
        raise ModelError(f"argument {name} must be a memref")
    if mr.data.size != size or mr.dtype != dtype:
        raise ModelError(f"argument {name} is {mr.data.size}x{mr.dtype}, the kernel expects {size}x{dtype}")
    return mr.data


def seq_sum(products: np.ndarray, init: np.ndarray) -> np.ndarray:
    """Row sums accumulated left to right in f32 starting from `init` (the host C++ loop's order, bit for bit:
    cumsum over float32 adds sequentially)."""
    return np.cumsum(np.concatenate([init[:, None], products], axis=1), axis=1, dtype=F32)[:, -1]


