"""numpy reference of the `gemv_q4_swiglu` kernel: the 4-bit GEMV of the gate and of the up weights (each rounded
to bf16 as the core stores them in L1), then the `swiglu` kernel's numerics on them: bit for bit the three
launches it replaces (gemv_q4, gemv_q4, swiglu)."""
from __future__ import annotations

from kernel_builder.gemv_q4.reference import gemv_q4
from kernel_builder.numerics import check_dims
from kernel_builder.swiglu.reference import swiglu


def gemv_q4_swiglu(w_gate, w_up, x, *, m: int, k: int, group: int, mins: int):
    check_dims("gemv_q4_swiglu", m=m, k=k)
    g = gemv_q4(w_gate, x, m=m, k=k, group=group, mins=mins)
    u = gemv_q4(w_up, x, m=m, k=k, group=group, mins=mins)
    return swiglu(g, u, rows=1, dim=m)
