"""The `gemm_bfp` kernel's builder: the GEMM module of kernel_builder/gemm/builder.py with the W operand at rest in
block float (w_format "bfp16": i8 [rows/8, 9k], kernel_builder/block_float.py), epilogue "none" or "swiglu" (the
[2n, k] gate/up weight interleaved by 8 rows, kernel_builder/gemm_swiglu/layout.py, then encoded)."""
from __future__ import annotations

from kernel_builder import block_float
from kernel_builder.gemm import builder as gemm_builder
from kernel_builder.gemm.external import C_FORMATS, GEMM_M_MULTIPLE, GEMM_N_MULTIPLE

EPILOGUES = ("none", "swiglu")   # this kind's; "bias" is kind gemm_bfp_bias (kernel_builder/gemm_bfp_bias)


def check(m: int, k: int, n: int, epilogue: str, kind: str = "gemm_bfp") -> None:
    """One clear error for a shape or epilogue this kernel does not take."""
    if kind == "gemm_bfp" and epilogue not in EPILOGUES:
        raise ValueError(f"gemm_bfp: unknown epilogue {epilogue!r} (known: {', '.join(EPILOGUES)})")
    if n <= 0 or k <= 0 or n % block_float.BLOCK or k % block_float.BLOCK:
        raise ValueError(f"{kind}: n={n} and k={k} must be positive multiples of {block_float.BLOCK} (the "
                         f"weight is stored in 8x8 block-float blocks)")
    if m <= 0 or m % GEMM_M_MULTIPLE or n % GEMM_N_MULTIPLE:
        raise ValueError(f"{kind}: m={m} must be a positive multiple of {GEMM_M_MULTIPLE} and n={n} of "
                         f"{GEMM_N_MULTIPLE} (the micro-kernel's 8x8 blocks, two column blocks per step)")


def build(m: int, k: int, n: int, epilogue: str = "none", a: str = "bf16", c: str = "bf16") -> str:
    """The module of c[m, n] = a[m, k] . W^T: arguments (a bf16 [m, k], w i8 [n/8, 9k] (swiglu: [2n/8, 9k]),
    c bf16 [m, n]). a="bfp16": a at rest in block float too, i8 [m/8, 9k] (kernel_builder/gemm/a_bfp.py);
    c="bfp16": c in block float, i8 [m/8, 9n], block_float.encode of the bf16 result (kernel_builder/gemm/c_bfp.py)."""
    check(m, k, n, epilogue)
    if c not in C_FORMATS:
        raise ValueError(f"gemm_bfp: unknown C format {c!r} (known: {', '.join(C_FORMATS)})")
    return gemm_builder.build(m, k, n, epilogue, "bfp16", a, c_format=c)
