"""The one table of element types: declaration name -> MLIR element type, bits, host (numpy) storage.

Every layer that sizes, transfers or interprets a device buffer (declarations, ModuleExecutor, devices,
interpreter, weights) reads it from here. `i4` is packed: two 4-bit values per byte, so a `[rows, n]` i4
argument is stored on the host as `[rows, n // 2]` uint8 and occupies rows * n / 2 bytes on the device.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .numerics import BF16


@dataclass(frozen=True)
class DType:
    name: str          # as written in a declaration (Arg.dtype)
    mlir: str          # memref element type
    bits: int          # bits per element on the device
    host: np.dtype     # numpy dtype of the host array that fills / receives the buffer

    @property
    def packed(self) -> int:
        """Elements per host storage unit (2 for i4, else 1)."""
        return max(1, self.host.itemsize * 8 // self.bits)

    def nbytes(self, shape: tuple[int, ...]) -> int:
        n = math.prod(shape) * self.bits
        if n % 8:
            raise ValueError(f"{self.name}: shape {list(shape)} is not a whole number of bytes")
        return n // 8

    def host_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        """Shape of the host array for a device shape (the last dimension packed for sub-byte types)."""
        if self.packed == 1:
            return tuple(shape)
        if not shape or shape[-1] % self.packed:
            raise ValueError(f"{self.name}: the last dimension of {list(shape)} must be a multiple of "
                             f"{self.packed} (packed {self.bits}-bit values)")
        return tuple(shape[:-1]) + (shape[-1] // self.packed,)


DTYPES: dict[str, DType] = {d.name: d for d in (
    DType("bf16", "bf16", 16, BF16),
    DType("f32", "f32", 32, np.dtype(np.float32)),
    DType("i32", "i32", 32, np.dtype(np.int32)),
    DType("i8", "i8", 8, np.dtype(np.int8)),
    DType("u8", "ui8", 8, np.dtype(np.uint8)),
    DType("i4", "i4", 4, np.dtype(np.uint8)),
    DType("f64", "f64", 64, np.dtype(np.float64)),   # host-side references only
)}
_BY_MLIR = {d.mlir: d for d in DTYPES.values()}


def dtype(name: str) -> DType:
    try:
        return DTYPES[name]
    except KeyError:
        raise ValueError(f"unsupported element type {name!r}; known: {', '.join(DTYPES)}") from None


def from_mlir(elem: str) -> DType:
    """The DType of a memref element type (`bf16`, `f32`, `i32`, `i8`, `ui8`, `i4`)."""
    try:
        return _BY_MLIR[elem]
    except KeyError:
        raise ValueError(f"unsupported memref element type {elem!r}") from None
