"""numpy reference of the `gemv` kernel (GEMV y = W x) with NPU numerics (kernel_builder.reference has the
contract: bf16 inputs, f32 arithmetic, one bf16 round-to-nearest-even on the output)."""
from __future__ import annotations

import numpy as np

from kernel_builder.numerics import BF16, check_dims, f32_input, to_bf16


def gemv_f32(w, x, *, m: int, k: int, kind: str = "gemv") -> np.ndarray:
    """w[m, k] @ x[k] in f32 (before the rounding). A bf16 `w` (the emulator passes its stored weights when the
    host kernels are built) goes to the host GEMV (kernel_builder.gemv.host: half the bytes of an f32 copy);
    an f32 one to BLAS."""
    check_dims(kind, m=m, k=k)
    wa = np.asarray(w)
    if wa.dtype == BF16 and wa.size == m * k:
        from external_kernels import host_build as host_native
        from kernel_builder.gemv import host as host_gemv
        lib = host_native.library()
        if lib is not None:
            return host_gemv.run(lib, np.ascontiguousarray(wa).reshape(m, k), f32_input(kind, "x", x, (k,)), m=m, k=k)
    return f32_input(kind, "w", w, (m, k)) @ f32_input(kind, "x", x, (k,))


def gemv(w, x, *, m: int, k: int) -> np.ndarray:
    """y[1, m] = w[m, k] @ x[k], f32 accumulation."""
    return to_bf16(gemv_f32(w, x, m=m, k=k)).reshape(1, m)
