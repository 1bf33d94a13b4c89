"""numpy reference of the `dequant_q4` kernel: the bf16 weight of a q4 row buffer (format.dequantize: d*q (+ m) in
f32, one RNE rounding: the weight gemv_q4 multiplies)."""
from __future__ import annotations

import numpy as np

from kernel_builder.gemv_q4.format import Q4Layout, dequantize
from kernel_builder.numerics import check_dims


def dequant_q4(w, *, m: int, k: int, group: int, mins: int) -> np.ndarray:
    """bf16 [m, k] from w: u8 [m, row_bytes] (the q4 row layout; i8 on the device)."""
    check_dims("dequant_q4", m=m, k=k)
    lay = Q4Layout(k, group, bool(mins))
    wa = np.asarray(w)
    wa = wa.view(np.uint8) if wa.dtype.itemsize == 1 else wa.astype(np.int8).view(np.uint8)
    if wa.size != m * lay.row_bytes:
        raise ValueError(f"dequant_q4: w has {wa.size} bytes, m={m} rows of {lay.row_bytes} bytes expected")
    from external_kernels import host_build
    lib = host_build.library()
    if lib is None:
        return dequantize(wa.reshape(m, lay.row_bytes), k, group, bool(mins))
    from kernel_builder.gemv.host import ROW_BLOCK
    from kernel_builder.host_threads import run_items
    from kernel_builder.numerics import BF16
    wc = np.ascontiguousarray(wa).reshape(m, lay.row_bytes)
    y = np.empty((m, k), dtype=BF16)

    def rows(r0):     # the emulator's host kernel (external_kernels/host/gemv_q4_host.cc): the same bits
        if lib.llama_npu_dequant_q4(wc.ctypes.data, y.ctypes.data, m, k, group, int(mins), lay.row_bytes, 4, r0,
                                    min(m, r0 + ROW_BLOCK)):
            raise ValueError(f"dequant_q4: the host kernel refused m={m}, k={k}, group={group}")
    run_items(rows, range(0, m, ROW_BLOCK), parallel=m * k >= 1 << 20)
    return y
