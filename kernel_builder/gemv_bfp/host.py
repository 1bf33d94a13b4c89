"""The emulator's block-float decode GEMV on the host CPU: external_kernels/host/gemv_bfp_host.cc reads the weight's
bytes at rest (9 bits per weight) and computes the reference's bits (kernel_builder/gemv_bfp/reference.py: x in
block float, exact integer block dots, f32 accumulation in K-block order) without decoding the weight to floats.
Large weights (the LM head) run in row blocks on kernel_builder.host_threads' pool; a row's bits do not depend on
the rows a call covers."""
from __future__ import annotations

import numpy as np

from kernel_builder.gemv.host import PARALLEL_MIN, ROW_BLOCK
from kernel_builder.host_threads import run_items


def run(lib, w: np.ndarray, x: np.ndarray, *, m: int, k: int) -> np.ndarray:
    """f32 y[m]; w: uint8 [m/8, 9k] (the at-rest bytes, checked by the caller); x: f32 or bf16 [k]."""
    wa = w if w.flags.c_contiguous else np.ascontiguousarray(w)
    xf = np.ascontiguousarray(x, dtype=np.float32).reshape(k)
    y = np.empty(m, dtype=np.float32)
    wp, xp, yp = wa.ctypes.data, xf.ctypes.data, y.ctypes.data     # plain addresses: wa, xf, y outlive the calls

    def rows(r0):
        if lib.llama_npu_gemv_bfp(wp, xp, yp, m, k, r0, min(m, r0 + ROW_BLOCK)):
            raise ValueError(f"gemv_bfp: the host kernel refused m={m}, k={k}")
    run_items(rows, range(0, m, ROW_BLOCK), parallel=m * k >= PARALLEL_MIN)
    return y
