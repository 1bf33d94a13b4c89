"""numpy reference of the `gemm_q4` kernel: the GEMM (kernel_builder/gemm/reference.py) on the dequantized weight
(dequant_q4's reference: format.dequantize, the same bits as the emulator's host dequantization), so a q4 prefill
GEMM gives the bits of dequant_q4 + gemm."""
from __future__ import annotations

from kernel_builder.dequant_q4.reference import dequant_q4
from kernel_builder.gemm.reference import gemm


def gemm_q4(a, w, *, m: int, k: int, n: int, group: int):
    """c[m, n] = a[m, k] @ dequant(w)^T; w: u8 (i8 on the device) [n, row_bytes] q4 rows with mins."""
    return gemm(a, dequant_q4(w, m=n, k=k, group=group, mins=1), m=m, k=k, n=n)
