"""numpy reference of the `gemv_bfp` kernel: the decode GEMV on weights at rest in block float
(kernel_builder.block_float: w[m, k] stored as bytes [m/8, 9k], bfp16ebs8 8x8 blocks), with the numerics of
AIE2P's block-float matrix unit (external_kernels/gemv_bfp.cc):

    y = bf16_rne( sum over k of bfp16(x)[k] * w[:, k]  (+ b) )

- w: the decoded weight (block_float.decode: exact, every value a bf16 value);
- bfp16(x) = kernel_builder.numerics.to_bfp16ebs8(x): x rounded to block float per 8 consecutive values (the
  matrix unit takes both operands in bfp16ebs8; x is converted in the core, once per K block);
- f32 accumulation in ascending K-block order: each 8-term block dot product dot(bfp16(x)[8j:8j+8],
  w[i, 8j:8j+8]) is exact (8-bit mantissas, one scale per block) and is added to the running f32 sum with one
  rounding (the host aie_api's model of mac_8x8_8x8T); the bias (gemv_bfp_bias) is added to the f32 sum, then one
  bf16 round-to-nearest-even. K chunks of the tile continue the same sum (the carried f32 partial sums), so the
  result does not depend on the plan.

The AIE2P vector path on the host aie_api and the C++ scalar path give these bits exactly (tests/test_gemv_bfp.py).
Against the bf16 GEMV on the same decoded weights the difference is x's rounding to block float (the largest
value of each 8 keeps 7 significant bits, smaller ones fewer) and the per-block accumulation order."""
from __future__ import annotations

import numpy as np

from kernel_builder import block_float
from kernel_builder.numerics import F32, check_dims, f32_input, to_bf16, to_bfp16ebs8

_DECODE_STEP = 1024     # weight rows decoded per step (bounds the float64 temporaries to ~1024 * k * 8 bytes)


def accumulate_blocks(wf: np.ndarray, xq: np.ndarray, init: np.ndarray) -> np.ndarray:
    """f32 sums of rows of wf [rows, kc] (decoded weights) times x [kc] rounded to block float per 8 (done here:
    `xq` may be plain x), starting from `init` [rows] f32, one f32 rounding per 8-term exact block dot product,
    blocks in ascending order."""
    rows, kc = wf.shape
    q = to_bfp16ebs8(np.asarray(xq, dtype=F32)).astype(np.float64).reshape(kc // 8, 8)
    dots = np.einsum("rbi,bi->rb", wf.reshape(rows, kc // 8, 8).astype(np.float64), q)   # exact per block
    s = np.asarray(init, dtype=F32).copy()
    for j in range(kc // 8):
        s = (s.astype(np.float64) + dots[:, j]).astype(F32)
    return s


def weight_bytes(kind: str, w, m: int, k: int) -> np.ndarray:
    """The at-rest bytes of w[m, k] as uint8 [m/8, 9k] (int8 on the device), or a ValueError naming the kind."""
    wa = np.asarray(w)
    if wa.dtype.itemsize != 1 or wa.dtype.kind not in "iu":
        raise ValueError(f"{kind}: w must be the block-float bytes (int8/uint8, kernel_builder.block_float.encode), "
                         f"got {wa.dtype}")
    want = m * k * block_float.GROUP_BYTES // block_float.BLOCK
    if wa.size != want:
        raise ValueError(f"{kind}: w has {wa.size} bytes, [{m}, {k}] in block float takes {want} ([{m // 8}, "
                         f"{block_float.row_bytes(k)}])")
    return wa.view(np.uint8).reshape(m // block_float.BLOCK, block_float.row_bytes(k))


def gemv_bfp_f32(w, x, *, m: int, k: int, kind: str = "gemv_bfp", host: bool = True) -> np.ndarray:
    """f32 y[m] before the rounding (see the module docstring): the host kernel on the stored bytes when the host
    kernels are built (kernel_builder.gemv_bfp.host, the same bits) and `host`, else numpy."""
    check_dims(kind, m=m, k=k)
    if m % block_float.BLOCK or k % block_float.BLOCK:
        raise ValueError(f"{kind}: m={m} and k={k} must be multiples of {block_float.BLOCK} (8x8 block-float blocks)")
    wb = weight_bytes(kind, w, m, k)
    xf = f32_input(kind, "x", x, (k,))
    if host:
        from external_kernels import host_build
        from kernel_builder.gemv_bfp import host as bfp_host
        lib = host_build.library()
        if lib is not None:
            return bfp_host.run(lib, wb, xf, m=m, k=k)
    out = np.empty(m, dtype=F32)
    zero = np.zeros(min(m, _DECODE_STEP), dtype=F32)
    for r0 in range(0, m, _DECODE_STEP):
        n = min(_DECODE_STEP, m - r0)
        wf = block_float.decode(wb[r0 // 8:(r0 + n) // 8], n, k)
        out[r0:r0 + n] = accumulate_blocks(wf, xf, zero[:n])
    return out


def gemv_bfp(w, x, *, m: int, k: int) -> np.ndarray:
    """y[1, m] = W x: w the block-float bytes of W [m, k] ([m/8, 9k]), x [1, k] bf16."""
    return to_bf16(gemv_bfp_f32(w, x, m=m, k=k)).reshape(1, m)
