"""The emulator's 4-bit decode GEMV on the host CPU: external_kernels/host/gemv_q4_host.cc reads the q4 rows as
stored (a quarter of the bf16 bytes), dequantizes each weight as the AIE2P kernel does and accumulates in the
bf16 host GEMV's order (kernel_builder/gemv/host.py): the same bits as that GEMV on the dequantized weights."""
from __future__ import annotations

import numpy as np

from kernel_builder.gemv.host import PARALLEL_MIN, ROW_BLOCK
from kernel_builder.host_threads import run_items


def run(lib, w: np.ndarray, x: np.ndarray, *, m: int, k: int, group: int, mins: int, row_bytes: int,
        bits: int = 4) -> np.ndarray:
    """f32 y[m]; w: u8 [m, row_bytes] contiguous (`bits`-bit codes); x: f32 or bf16 [k]. A row's bits do not
    depend on the rows a call covers: a decode-sized weight is one call on this thread."""
    fn = lib.llama_npu_gemv_q8 if bits == 8 else lib.llama_npu_gemv_q4
    wa = w if w.dtype == np.uint8 and w.flags.c_contiguous else np.ascontiguousarray(w).view(np.uint8)
    xf = np.ascontiguousarray(x, dtype=np.float32).reshape(k)
    y = np.empty(m, dtype=np.float32)
    wp, xp, yp = wa.ctypes.data, xf.ctypes.data, y.ctypes.data

    def rows(r0, r1):
        if fn(wp, xp, yp, m, k, group, int(mins), row_bytes, r0, r1):
            raise ValueError(f"gemv_q4: the host kernel refused m={m}, k={k}, group={group}")
    if m * k < 4 * PARALLEL_MIN:
        rows(0, m)
    else:
        run_items(lambda r0: rows(r0, min(m, r0 + ROW_BLOCK)), range(0, m, ROW_BLOCK))
    return y
