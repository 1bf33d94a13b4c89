"""numpy reference of every kernel with NPU numerics: bf16 inputs, float32 arithmetic, one bf16
round-to-nearest-even on the output.

The emulator calls `KERNELS[kind](*inputs, **params)` with the inputs in the canonical argument order of
docs/architecture.md (outputs are not passed) and the params of the `llama_npu.kernel` launch attribute.
Inputs may be bf16 or float32 arrays (holding bf16-representable values), flat or 2-D; they are reshaped to the
documented shapes and never modified. These run hundreds of times per decoded token, so they avoid copies:
bf16 -> f32 conversion once, matmuls in f32.
"""
from __future__ import annotations

import math
from typing import Callable

import numpy as np

from kernel_builder.host_threads import run_items
from kernel_builder.numerics import BF16, to_bf16

F32 = np.float32
_SCORE_ELEMENTS_PER_BATCH = 1 << 25  # f64 scores: ~256 MiB per batch


# ----------------------------------------------------------------------------------------------- helpers

def _dims(kernel: str, **dims) -> None:
    for name, value in dims.items():
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value <= 0:
            raise ValueError(f"{kernel}: parameter {name} must be a positive int, got {value!r}")


def _input(kernel: str, name: str, x, shape: tuple[int, ...]) -> np.ndarray:
    """`x` as float32 with `shape` (a view when x is already f32 and contiguous)."""
    x = np.asarray(x)
    if x.dtype != BF16 and x.dtype != np.float32:
        raise ValueError(f"{kernel}: input {name} must be bf16 or float32, got {x.dtype}")
    expected = math.prod(shape)
    if x.size != expected:
        raise ValueError(f"{kernel}: input {name} has {x.size} elements (shape {x.shape}), expected {shape}")
    return x.reshape(shape).astype(F32, copy=False)


def attention_scale(head_dim: int) -> float:
    """1/sqrt(head_dim) rounded to float32: the softmax scale shared by the reference and the C++ kernels."""
    return float(F32(1.0 / math.sqrt(head_dim)))


# ----------------------------------------------------------------------------------------------- kernels

def rmsnorm(x, w, *, rows: int, dim: int, eps: float, group: int = 0) -> np.ndarray:
    """y = x * rsqrt(mean(x^2) + eps) * w per row; one rounding at the end. With `group` (a divisor of dim),
    every `group` consecutive elements of a row are normalised on their own with w of shape [group] (the
    per-head q/k norm of Qwen3-style models)."""
    _dims("rmsnorm", rows=rows, dim=dim)
    g = group or dim
    if dim % g:
        raise ValueError(f"rmsnorm: group={group} does not divide dim={dim}")
    xf = _input("rmsnorm", "x", x, (rows * (dim // g), g))
    wf = _input("rmsnorm", "w", w, (g,))
    mean_sq = np.einsum("ij,ij->i", xf, xf, dtype=F32) / F32(g)
    inv = F32(1.0) / np.sqrt(mean_sq + F32(eps), dtype=F32)
    return to_bf16((xf * inv[:, None]) * wf).reshape(rows, dim)


# Rows per BLAS call in gemm: every call has the same shape, so a row's result never depends on m.
_GEMM_ROW_BLOCK = 64
_GEMM_PARALLEL_MIN_MACS = 1 << 24   # below this a GEMM runs on the calling thread (pool hand-off ~0.1 ms)


def gemm(a, w, *, m: int, k: int, n: int) -> np.ndarray:
    """c[m, n] = a[m, k] @ w[n, k]^T (w in the Hugging Face [out, in] layout, like gemv), f32 accumulation,
    one bf16 rounding.

    BLAS sgemm picks its micro-kernel (and so the summation order) by matrix height, so a plain `a @ w.T`
    would make a prompt row's result depend on the prefill bucket. On the NPU a row's accumulation order is
    fixed by the tiling, never by the other rows; computing in fixed 64-row blocks (zero-padded) restores
    that row independence (padding invariance is bit-exact, tested) at f32 speed. Large GEMMs run their blocks
    on the emulator's thread pool (kernel_builder.host_threads): the same calls, so the same bits.
    """
    _dims("gemm", m=m, k=k, n=n)
    af = _input("gemm", "a", a, (m, k))
    wt = _input("gemm", "w", w, (n, k)).T  # a view: BLAS reads the [n, k] rows as the transposed operand
    blk = _GEMM_ROW_BLOCK
    padded = -(-m // blk) * blk
    if padded != m:
        af = np.concatenate([af, np.zeros((padded - m, k), dtype=F32)])
    c = np.empty((padded, n), dtype=F32)

    def block(r):
        np.matmul(af[r:r + blk], wt, out=c[r:r + blk])
    # the blocks are independent calls of one shape: on the emulator's pool they give the same bits
    run_items(block, range(0, padded, blk), parallel=padded * k * n >= _GEMM_PARALLEL_MIN_MACS)
    return to_bf16(c[:m])


def gemv(w, x, *, m: int, k: int) -> np.ndarray:
    """y[1, m] = w[m, k] @ x[k], f32 accumulation. A bf16 `w` (the emulator passes its stored weights when the
    host kernels are built) goes to the host GEMV (kernel_builder.gemv.host: half the bytes of an f32 copy);
    an f32 one to BLAS."""
    _dims("gemv", m=m, k=k)
    wa = np.asarray(w)
    if wa.dtype == BF16 and wa.size == m * k:
        from kernel_builder.gemv import host as host_gemv
        from external_kernels import host_build as host_native
        lib = host_native.library()
        if lib is not None:
            return to_bf16(host_gemv.run(lib, np.ascontiguousarray(wa).reshape(m, k),
                                         _input("gemv", "x", x, (k,)), m=m, k=k)).reshape(1, m)
    y = _input("gemv", "w", w, (m, k)) @ _input("gemv", "x", x, (k,))
    return to_bf16(y).reshape(1, m)


def rope(x, lut, *, rows: int, heads: int, head_dim: int) -> np.ndarray:
    """Half-split RoPE: per head, y1 = x1*cos - x2*sin, y2 = x2*cos + x1*sin with lut row = [cos | sin]."""
    _dims("rope", rows=rows, heads=heads, head_dim=head_dim)
    if head_dim % 2:
        raise ValueError(f"rope: head_dim={head_dim} must be even")
    half = head_dim // 2
    xf = _input("rope", "x", x, (rows, heads, head_dim))
    lf = _input("rope", "lut", lut, (rows, 1, head_dim))
    x1, x2 = xf[..., :half], xf[..., half:]
    cos, sin = lf[..., :half], lf[..., half:]
    y = np.empty_like(xf)
    # bf16*bf16 products are exact in f32, so this equals the C++ order of operations bit for bit.
    np.subtract(x1 * cos, x2 * sin, out=y[..., :half])
    np.add(x2 * cos, x1 * sin, out=y[..., half:])
    return to_bf16(y.reshape(rows, heads * head_dim))


def swiglu(gate, up, *, rows: int, dim: int) -> np.ndarray:
    """y = silu(gate) * up, silu(g) = g / (1 + exp(-g))."""
    _dims("swiglu", rows=rows, dim=dim)
    g = _input("swiglu", "gate", gate, (rows, dim))
    u = _input("swiglu", "up", up, (rows, dim))
    with np.errstate(over="ignore"):  # exp(-g) -> inf for very negative g gives silu = -0, as intended
        return to_bf16(g / (F32(1.0) + np.exp(-g)) * u)


def flash_attn(q, k, v, *, seq: int, heads: int, kv_heads: int, head_dim: int, causal: int) -> np.ndarray:
    """Multi-head (GQA) attention over `seq` positions; query head h uses kv head h // (heads // kv_heads).

    scores = q.k^T * attention_scale(head_dim) in f32, causal mask (key j > query i excluded), softmax in f32
    (max-subtracted), out = (p @ v) / sum(p), rounded once to bf16.
    """
    _dims("flash_attn", seq=seq, heads=heads, kv_heads=kv_heads, head_dim=head_dim)
    if heads % kv_heads:
        raise ValueError(f"flash_attn: heads={heads} is not a multiple of kv_heads={kv_heads}")
    group = heads // kv_heads
    qf = _input("flash_attn", "q", q, (seq, heads, head_dim))
    kf = _input("flash_attn", "k", k, (seq, kv_heads, head_dim))
    vf = _input("flash_attn", "v", v, (seq, kv_heads, head_dim))
    # [kv_heads, group*seq, hd]: the query heads sharing one kv head stacked along rows -> one batched matmul.
    qg = qf.reshape(seq, kv_heads, group, head_dim).transpose(1, 2, 0, 3).reshape(kv_heads, group * seq, head_dim)
    kt = kf.transpose(1, 2, 0)  # [kv_heads, hd, seq]
    vh = vf.transpose(1, 0, 2)  # [kv_heads, seq, hd]
    scale = F32(attention_scale(head_dim))
    future = np.triu(np.ones((seq, seq), dtype=bool), k=1) if causal else None  # [query, key]: key after query
    out = np.empty((kv_heads, group * seq, head_dim), dtype=F32)
    # Batches of kv heads bound the f32 score tensor (~256 MiB) for long prefill buckets.
    step = max(1, _SCORE_ELEMENTS_PER_BATCH // (group * seq * seq))
    for h0 in range(0, kv_heads, step):
        h1 = min(kv_heads, h0 + step)
        # f64: the key count changes with the bucket, so f32 BLAS sums would make a query row's result depend
        # on the bucket it runs in (see gemm for the same issue along rows).
        scores = np.matmul(qg[h0:h1].astype(np.float64), kt[h0:h1].astype(np.float64))  # [b, group*seq, seq]
        scores *= scale
        if future is not None:
            scores.reshape(h1 - h0, group, seq, seq)[:, :, future] = -np.inf  # view: masks in place
        scores -= scores.max(axis=-1, keepdims=True)
        np.exp(scores, out=scores)
        denom = scores.sum(axis=-1, keepdims=True)
        np.divide(np.matmul(scores, vh[h0:h1].astype(np.float64)), denom, out=out[h0:h1], casting="same_kind")
    out = out.reshape(kv_heads, group, seq, head_dim).transpose(2, 0, 1, 3).reshape(seq, heads * head_dim)
    return to_bf16(out)


_ATTN_QB = 256   # query rows per block: a block reads only the keys up to its last row (causal work)
_EXP_FLOOR = F32(-87.0)  # exp(-87) = 1.6e-38, the smallest normal f32 is 1.2e-38


def _attention_position(pos, *, rows: int, kv_rows: int, heads: int, kv_heads: int, head_dim: int) -> int:
    """Checks attention's parameters; returns the first query row's position."""
    _dims("attention", rows=rows, kv_rows=kv_rows, heads=heads, kv_heads=kv_heads, head_dim=head_dim)
    if heads % kv_heads:
        raise ValueError(f"attention: heads={heads} is not a multiple of kv_heads={kv_heads}")
    p = int(np.asarray(pos).reshape(-1)[0])
    if not 0 <= p or p + rows > kv_rows:
        raise ValueError(f"attention: rows at positions [{p}, {p + rows}) are outside the {kv_rows}-row KV window")
    return p


def attention(q, k, v, pos, *, rows: int, kv_rows: int, heads: int, kv_heads: int, head_dim: int) -> np.ndarray:
    """Causal GQA attention of `rows` query rows at absolute positions pos..pos+rows-1 over a KV window of
    `kv_rows` positions starting at position 0 (a window of the KV cache): query i sees keys j <= pos + i
    (keys past the window or past the query are masked, whatever they hold). Query head h uses kv head
    h // (heads // kv_heads). `pos` is an int or a 1-element int32 array (the kernel's scalar operand).

    A row gives the same bytes in a prefill chunk of any size or position and alone in decode. Two
    implementations keep that promise, each on its own, and agree within bf16 rounding: the host C++ kernel
    (kernel_builder.attention.host: f32 in one fixed order per element, on every core), used when a C++
    compiler is at hand, and `attention_numpy` (exact f64 products) otherwise."""
    p = _attention_position(pos, rows=rows, kv_rows=kv_rows, heads=heads, kv_heads=kv_heads, head_dim=head_dim)
    from kernel_builder.attention import host as host_attention
    from external_kernels import host_build as host_native
    lib = host_native.library() if head_dim % 16 == 0 else None
    if lib is None:
        return attention_numpy(q, k, v, pos, rows=rows, kv_rows=kv_rows, heads=heads, kv_heads=kv_heads,
                               head_dim=head_dim)
    qf = _input("attention", "q", q, (rows, heads * head_dim))
    kf = _input("attention", "k", k, (kv_rows, kv_heads * head_dim))
    vf = _input("attention", "v", v, (kv_rows, kv_heads * head_dim))
    out = host_attention.run(lib, qf, kf, vf, p, rows=rows, heads=heads, kv_heads=kv_heads, head_dim=head_dim,
                             scale=attention_scale(head_dim))
    return to_bf16(out)


def attention_numpy(q, k, v, pos, *, rows: int, kv_rows: int, heads: int, kv_heads: int, head_dim: int) -> np.ndarray:
    """`attention` in numpy (the path without a C++ compiler). The number of keys a row is computed against
    (and so the BLAS summation order) changes with the chunk it runs in; every step is either order-free or far below a bf16 ulp, so a row gives the same bytes in a
    prefill chunk of any size or position and alone in decode: QK^T in f64 (64 products of bf16 pairs sum
    exactly), rounded once to f32; max, scale and exp per element in f32 (the exp pass is most of the time);
    the denominator and P.V summed in f64; one bf16 rounding at the end. Blocks of 256 query rows read only
    the keys up to their last row."""
    p = _attention_position(pos, rows=rows, kv_rows=kv_rows, heads=heads, kv_heads=kv_heads, head_dim=head_dim)
    group, n = heads // kv_heads, p + rows       # keys past the last query are always masked: never read
    scale = attention_scale(head_dim)
    qf = _input("attention", "q", q, (rows, kv_heads, group, head_dim)).transpose(1, 2, 0, 3)  # [kv, g, rows, hd]
    kf = np.ascontiguousarray(_input("attention", "k", k, (kv_rows, kv_heads, head_dim))[:n].transpose(1, 0, 2),
                              dtype=np.float64)                                                # [kv, n, hd]
    vf = np.ones((kv_heads, n, head_dim + 1))              # [kv, n, hd | 1]: P.[V | 1] gives the denominator too
    vf[:, :, :head_dim] = _input("attention", "v", v, (kv_rows, kv_heads, head_dim))[:n].transpose(1, 0, 2)
    out = np.empty((kv_heads, group, rows, head_dim), dtype=F32)
    # Work buffers sized for the widest block, reused by every block and head: fresh multi-MiB temporaries
    # cost more in page faults than the passes themselves. Mixed f32 @ f64 matmuls skip BLAS, so P is
    # copied to f64 explicitly before P.[V | 1].
    width = group * min(rows, _ATTN_QB) * n
    s64, e32 = np.empty(width), np.empty(width, dtype=F32)
    for r0 in range(0, rows, _ATTN_QB):
        r1 = min(rows, r0 + _ATTN_QB)
        rb, m = r1 - r0, p + r1                                      # keys this block may see: [0, m)
        future = np.triu(np.ones((rb, rb), dtype=bool), k=1)         # key p+r0+c is past query r0+r when c > r
        s, e = s64[:group * rb * m].reshape(group * rb, m), e32[:group * rb * m].reshape(group * rb, m)
        for h in range(kv_heads):                                    # one 2-D BLAS product per kv head
            qb = qf[h, :, r0:r1].reshape(group * rb, head_dim).astype(np.float64)
            np.matmul(qb, kf[h, :m].T, out=s)                        # [g*rb, m]: exact f64 sums
            s.reshape(group, rb, m)[:, :, p + r0:][:, future] = -np.inf
            np.subtract(s, s.max(axis=-1, keepdims=True), out=e, casting="same_kind")  # one f32 rounding
            e *= F32(scale)
            np.maximum(e, _EXP_FLOOR, out=e)     # exp of a lower score would be an f32 denormal: 2x slower
            np.exp(e, out=e)
            e.reshape(group, rb, m)[:, :, p + r0:][:, future] = 0.0   # the floor lifted them: masked again
            np.copyto(s, e)
            o = s @ vf[h, :m]                                          # f64 sums over the keys
            out[h, :, r0:r1] = (o[:, :head_dim] / o[:, head_dim:]).reshape(group, rb, head_dim)
    return to_bf16(out.transpose(2, 0, 1, 3).reshape(rows, heads * head_dim))


def decode_attn(q, k, v, pos, *, kv_rows: int, heads: int, kv_heads: int, head_dim: int) -> np.ndarray:
    """One query row (the token at position `pos`) against positions 0..pos of a [kv_rows, kv_dim] window:
    `attention` with rows=1."""
    return attention(q, k, v, pos, rows=1, kv_rows=kv_rows, heads=heads, kv_heads=kv_heads, head_dim=head_dim)


def add(a, b, *, rows: int, dim: int, flat_out: int = 0) -> np.ndarray:
    """y = a + b (residual add); `flat_out` returns [rows*dim] instead of [rows, dim]."""
    _dims("add", rows=rows, dim=dim)
    y = to_bf16(_input("add", "a", a, (rows, dim)) + _input("add", "b", b, (rows, dim)))
    return y.reshape(rows * dim) if flat_out else y


KERNELS: dict[str, Callable[..., np.ndarray]] = {
    "rmsnorm": rmsnorm,
    "gemm": gemm,
    "gemv": gemv,
    "rope": rope,
    "swiglu": swiglu,
    "flash_attn": flash_attn,
    "attention": attention,
    "decode_attn": decode_attn,
    "add": add,
}
