"""numpy reference of the `dequant_q4` kernel: q4 rows (kernel_builder.gemv_q4.format) -> bf16 rows, exactly the
weights gemv_q4 multiplies (one RNE rounding per weight)."""
from __future__ import annotations

import numpy as np

from kernel_builder.gemv_q4.format import Q4Layout, dequantize


def dequant_q4(w, *, rows: int, k: int, group: int = 32, mins: int = 1) -> np.ndarray:
    lay = Q4Layout(k, group, bool(mins))
    a = np.asarray(w)
    if a.size != rows * lay.row_bytes:
        raise ValueError(f"dequant_q4: w has {a.size} bytes, expected {rows} rows of {lay.row_bytes}")
    return dequantize(a.reshape(-1).view(np.uint8).reshape(rows, lay.row_bytes), k, group, bool(mins))
