"""numpy reference of the `gemv_q4` kernel: y = dequantize(w) @ x with NPU numerics (the weight dequantized to
bf16 as the core does, format.dequantize; f32 accumulation; one bf16 RNE rounding of the output)."""
from __future__ import annotations

from functools import lru_cache

import numpy as np

from external_kernels import host_build
from kernel_builder.gemv.reference import gemv_f32
from kernel_builder.gemv_q4 import host
from kernel_builder.gemv_q4.format import Q4Layout, dequantize
from kernel_builder.numerics import check_dims, f32_input, to_bf16


@lru_cache(maxsize=None)
def _row_bytes(k: int, group: int, mins: int, bits: int) -> int:
    """Q4Layout(...).row_bytes, checked once per shape (a decode token asks ~200 times)."""
    return Q4Layout(k, group, bool(mins), bits).row_bytes


def gemv_q4_f32(w, x, *, m: int, k: int, group: int, mins: int, bits: int = 4, kind: str = "gemv_q4") -> np.ndarray:
    """f32 y[m] before the rounding, from w: u8 [m, row_bytes] (the q4 row layout; `bits` 4 or 8) and x[k]: the
    host q4 GEMV on the rows as stored when the host kernels are built (the same bits as the GEMV on the
    dequantized weights, tests/test_gemv_q4.py), else that GEMV."""
    check_dims(kind, m=m, k=k)
    row_bytes = _row_bytes(k, group, mins, bits)
    wa = np.asarray(w)
    wa = wa.view(np.uint8) if wa.dtype.itemsize == 1 else wa.astype(np.int8).view(np.uint8)   # bytes (i8 on device)
    if wa.size != m * row_bytes:
        raise ValueError(f"{kind}: w has {wa.size} bytes, m={m} rows of {row_bytes} bytes expected")
    lib = host_build.library()
    if lib is not None:
        return host.run(lib, wa, f32_input(kind, "x", x, (k,)), m=m, k=k, group=group, mins=mins,
                        row_bytes=row_bytes, bits=bits)
    return gemv_f32(dequantize(wa, k, group, bool(mins), bits), x, m=m, k=k, kind=kind)


def gemv_q4(w, x, *, m: int, k: int, group: int, mins: int, bits: int = 4) -> np.ndarray:
    """y[1, m] from w: u8 [m, row_bytes] (the q4 row layout; `bits` 4 or 8) and x[k]."""
    return to_bf16(gemv_q4_f32(w, x, m=m, k=k, group=group, mins=mins, bits=bits)).reshape(1, m)
