"""numpy reference of the `gemm_bfp` kernel (kernel_builder.reference has the contract): the gemm (or gemm_swiglu)
reference on the decoded block-float weight (block_float.decode: exact bf16 values), i.e. f32 arithmetic on the
values the weight holds, one bf16 rounding of the output (with glu: swiglu of the two rounded products)."""
from __future__ import annotations

import numpy as np

from kernel_builder import block_float
from kernel_builder.gemm.reference import gemm
from kernel_builder.gemm_swiglu.reference import gemm_swiglu


def gemm_bfp(a, w, *, m: int, k: int, n: int, glu: int = 0, a_bfp: int = 0, c_bfp: int = 0) -> np.ndarray:
    """c[m, n] = a[m, k] . decode(w)^T with w the at-rest bytes [n/8, 9k] (glu: [2n/8, 9k], the gate and up rows
    interleaved by 8, and c = silu(a . wg^T) * (a . wu^T)). a_bfp: a is at rest in block float too, the bytes
    [m/8, 9k], decoded first (exact bf16 values). c_bfp: C in block float, block_float.encode of that bf16 result:
    i8 [m/8, 9n] (the at-rest format of the weights)."""
    if a_bfp:
        a = block_float.decode(np.asarray(a).reshape(-1), m, k)
    rows = 2 * n if glu else n
    wf = block_float.decode(np.asarray(w).reshape(-1), rows, k)
    c = gemm_swiglu(a, wf, m=m, k=k, n=n) if glu else gemm(a, wf, m=m, k=k, n=n)
    return block_float.encode(c.astype(np.float32)).view(np.int8) if c_bfp else c
