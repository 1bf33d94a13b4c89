"""numpy reference of the `attention` kernel (causal GQA attention) with NPU numerics (kernel_builder.reference has the
contract: bf16 inputs, f32 arithmetic, one bf16 round-to-nearest-even on the output)."""
from __future__ import annotations

import math

import numpy as np

from kernel_builder.numerics import F32, check_dims, f32_input, to_bf16

_SCORE_ELEMENTS_PER_BATCH = 1 << 25  # f64 scores: ~256 MiB per batch


def attention_scale(head_dim: int) -> float:
    """1/sqrt(head_dim) rounded to float32: the softmax scale shared by the reference and the C++ kernels."""
    return float(F32(1.0 / math.sqrt(head_dim)))


def flash_attn(q, k, v, *, seq: int, heads: int, kv_heads: int, head_dim: int, causal: int) -> np.ndarray:
    """Multi-head (GQA) attention over `seq` positions; query head h uses kv head h // (heads // kv_heads).

    scores = q.k^T * attention_scale(head_dim) in f32, causal mask (key j > query i excluded), softmax in f32
    (max-subtracted), out = (p @ v) / sum(p), rounded once to bf16.
    """
    check_dims("flash_attn", seq=seq, heads=heads, kv_heads=kv_heads, head_dim=head_dim)
    if heads % kv_heads:
        raise ValueError(f"flash_attn: heads={heads} is not a multiple of kv_heads={kv_heads}")
    group = heads // kv_heads
    qf = f32_input("flash_attn", "q", q, (seq, heads, head_dim))
    kf = f32_input("flash_attn", "k", k, (seq, kv_heads, head_dim))
    vf = f32_input("flash_attn", "v", v, (seq, kv_heads, head_dim))
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
    check_dims("attention", rows=rows, kv_rows=kv_rows, heads=heads, kv_heads=kv_heads, head_dim=head_dim)
    if heads % kv_heads:
        raise ValueError(f"attention: heads={heads} is not a multiple of kv_heads={kv_heads}")
    p = int(np.asarray(pos).reshape(-1)[0])
    if not 0 <= p or p + rows > kv_rows:
        raise ValueError(f"attention: rows at positions [{p}, {p + rows}) are outside the {kv_rows}-row KV window")
    return p


def attention(q, k, v, pos, *, rows: int, kv_rows: int, heads: int, kv_heads: int, head_dim: int,
              window: int | None = None, scale_dim: int | None = None) -> np.ndarray:
    """Causal GQA attention of `rows` query rows at absolute positions pos..pos+rows-1 over a KV window of
    `kv_rows` positions starting at position 0 (a window of the KV cache): query i sees keys j <= pos + i
    (keys past the window or past the query are masked, whatever they hold). Query head h uses kv head
    h // (heads // kv_heads). `pos` is an int or a 1-element int32 array (the kernel's scalar operand).
    `window` (None: full causal): a sliding window, query i sees keys pos + i - window < j <= pos + i
    (transformers' sliding_window_overlay). `scale_dim` (None: head_dim): the softmax scale is
    attention_scale(scale_dim) (Gemma's query_pre_attn_scalar).

    A row gives the same bytes in a prefill chunk of any size or position and alone in decode. Two
    implementations keep that promise, each on its own, and agree within bf16 rounding: the host C++ kernel
    (kernel_builder.attention.host: f32 in one fixed order per element, on every core), used when a C++
    compiler is at hand, and `attention_numpy` (exact f64 products) otherwise."""
    p = _attention_position(pos, rows=rows, kv_rows=kv_rows, heads=heads, kv_heads=kv_heads, head_dim=head_dim)
    from external_kernels import host_build as host_native
    from kernel_builder.attention import host as host_attention
    # the host C++ kernel is full causal: a sliding window runs in numpy (in prefill and decode alike, so a row
    # still gives the same bytes in any chunk)
    lib = host_native.library() if head_dim % 16 == 0 and not window else None
    if lib is None:
        return attention_numpy(q, k, v, pos, rows=rows, kv_rows=kv_rows, heads=heads, kv_heads=kv_heads,
                               head_dim=head_dim, window=window, scale_dim=scale_dim)
    qf = f32_input("attention", "q", q, (rows, heads * head_dim))
    kf = f32_input("attention", "k", k, (kv_rows, kv_heads * head_dim))
    vf = f32_input("attention", "v", v, (kv_rows, kv_heads * head_dim))
    out = host_attention.run(lib, qf, kf, vf, p, rows=rows, heads=heads, kv_heads=kv_heads, head_dim=head_dim,
                             scale=attention_scale(scale_dim or head_dim))
    return to_bf16(out)


def attention_numpy(q, k, v, pos, *, rows: int, kv_rows: int, heads: int, kv_heads: int, head_dim: int,
                    window: int | None = None, scale_dim: int | None = None) -> np.ndarray:
    """`attention` in numpy (the path without a C++ compiler). The number of keys a row is computed against
    (and so the BLAS summation order) changes with the chunk it runs in; every step is either order-free or far below a bf16 ulp, so a row gives the same bytes in a
    prefill chunk of any size or position and alone in decode: QK^T in f64 (64 products of bf16 pairs sum
    exactly), rounded once to f32; max, scale and exp per element in f32 (the exp pass is most of the time);
    the denominator and P.V summed in f64; one bf16 rounding at the end. Blocks of 256 query rows read only
    the keys up to their last row."""
    p = _attention_position(pos, rows=rows, kv_rows=kv_rows, heads=heads, kv_heads=kv_heads, head_dim=head_dim)
    group, n = heads // kv_heads, p + rows       # keys past the last query are always masked: never read
    scale = attention_scale(scale_dim or head_dim)
    if window is not None and window <= 0:
        raise ValueError(f"attention: window={window} must be positive (None: full causal)")
    qf = f32_input("attention", "q", q, (rows, kv_heads, group, head_dim)).transpose(1, 2, 0, 3)  # [kv, g, rows, hd]
    kf = np.ascontiguousarray(f32_input("attention", "k", k, (kv_rows, kv_heads, head_dim))[:n].transpose(1, 0, 2),
                              dtype=np.float64)                                                # [kv, n, hd]
    vf = np.ones((kv_heads, n, head_dim + 1))              # [kv, n, hd | 1]: P.[V | 1] gives the denominator too
    vf[:, :, :head_dim] = f32_input("attention", "v", v, (kv_rows, kv_heads, head_dim))[:n].transpose(1, 0, 2)
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
        if window:   # key j is before the window of query p+r0+r when j <= p + r0 + r - window
            before = np.arange(m)[None, :] <= (p + r0 + np.arange(rb))[:, None] - window      # [rb, m]
        s, e = s64[:group * rb * m].reshape(group * rb, m), e32[:group * rb * m].reshape(group * rb, m)
        for h in range(kv_heads):                                    # one 2-D BLAS product per kv head
            qb = qf[h, :, r0:r1].reshape(group * rb, head_dim).astype(np.float64)
            np.matmul(qb, kf[h, :m].T, out=s)                        # [g*rb, m]: exact f64 sums
            s.reshape(group, rb, m)[:, :, p + r0:][:, future] = -np.inf
            if window:
                s.reshape(group, rb, m)[:, before] = -np.inf
            np.subtract(s, s.max(axis=-1, keepdims=True), out=e, casting="same_kind")  # one f32 rounding
            e *= F32(scale)
            np.maximum(e, _EXP_FLOOR, out=e)     # exp of a lower score would be an f32 denormal: 2x slower
            np.exp(e, out=e)
            e.reshape(group, rb, m)[:, :, p + r0:][:, future] = 0.0   # the floor lifted them: masked again
            if window:
                e.reshape(group, rb, m)[:, before] = 0.0
            np.copyto(s, e)
            o = s @ vf[h, :m]                                          # f64 sums over the keys
            out[h, :, r0:r1] = (o[:, :head_dim] / o[:, head_dim:]).reshape(group, rb, head_dim)
    return to_bf16(out.transpose(2, 0, 1, 3).reshape(rows, heads * head_dim))


def decode_attn(q, k, v, pos, *, kv_rows: int, heads: int, kv_heads: int, head_dim: int, window: int | None = None,
                scale_dim: int | None = None) -> np.ndarray:
    """One query row (the token at position `pos`) against positions 0..pos of a [kv_rows, kv_dim] window:
    `attention` with rows=1."""
    return attention(q, k, v, pos, rows=1, kv_rows=kv_rows, heads=heads, kv_heads=kv_heads, head_dim=head_dim,
                     window=window, scale_dim=scale_dim)


def attention_block_float(q, k, v, pos, *, rows: int, kv_rows: int, heads: int, kv_heads: int, head_dim: int,
                          window: int | None = None, scale_dim: int | None = None, lk: int = 64) -> np.ndarray:
    """`attention` with the arithmetic of attention.cc's AIE2P prefill path (block-float matrix unit): Q scaled by
    scale*log2(e) (a bf16 pair of the constant, exact products) and rounded to bf16; S = Q.K^T and P.V with both
    operands in bfp16ebs8 (numerics.to_bfp16ebs8: 8 values along the contraction share an exponent; exact block
    products, f32 sums); an online softmax over K/V tiles of `lk` keys in log2 units with bf16 probabilities
    (exp2 returns bf16); out = acc / l rounded to bf16. Keys after the chunk's last query are zeroed in V, as the
    kernel does for the keys no row of its tile sees. A model of the kernel's numerics (the emulator's contract
    stays `attention`): tests/test_attention_block_float.py compares the kernel's host aie_api run with it, and the
    verify gate runs with it (docs/hardware-model.md, "Attention numerics")."""
    from kernel_builder.numerics import to_bfp16ebs8

    p0 = _attention_position(pos, rows=rows, kv_rows=kv_rows, heads=heads, kv_heads=kv_heads, head_dim=head_dim)
    group, hd = heads // kv_heads, head_dim
    c = F32(F32(attention_scale(scale_dim or head_dim)) * F32(1.4426950408889634))
    c_hi = to_bf16(np.array([c], F32)).astype(F32)[0]
    c_lo = to_bf16(np.array([c - c_hi], F32)).astype(F32)[0]
    qf = f32_input("attention", "q", q, (rows, kv_heads, group, hd)).transpose(1, 2, 0, 3).reshape(kv_heads, -1, hd)
    qs = to_bf16((qf * c_hi).astype(F32) + (qf * c_lo).astype(F32)).astype(F32)
    qb = to_bfp16ebs8(qs).astype(np.float64)                                        # [kv, g*rows, hd]
    n = -(-(p0 + rows) // lk) * lk                                                  # keys up to the last query's tile
    kf = np.zeros((kv_heads, n, hd), F32)
    vf = np.zeros((kv_heads, n, hd), F32)
    last = p0 + rows
    kf[:, :min(n, last)] = f32_input("attention", "k", k, (kv_rows, kv_heads, hd))[:min(n, last)].transpose(1, 0, 2)
    vf[:, :min(n, last)] = f32_input("attention", "v", v, (kv_rows, kv_heads, hd))[:min(n, last)].transpose(1, 0, 2)
    qpos = np.tile(p0 + np.arange(rows), group)                                     # [g*rows]
    m = np.full((kv_heads, group * rows), np.finfo(F32).min, F32)
    l_ = np.zeros((kv_heads, group * rows), F32)
    acc = np.zeros((kv_heads, group * rows, hd), F32)
    for k0 in range(0, n, lk):
        keys = k0 + np.arange(lk)
        keep = keys[None, :] <= qpos[:, None]
        if window:
            keep &= keys[None, :] > qpos[:, None] - window
        live = keep.any(axis=1)
        if not live.any():
            continue
        kb = to_bfp16ebs8(kf[:, k0:k0 + lk]).astype(np.float64)
        s = np.einsum("hqd,hkd->hqk", qb, kb).astype(F32)
        rmax = np.where(keep[None], s, np.finfo(F32).min).max(axis=2)
        mn = np.maximum(m, rmax)
        with np.errstate(over="ignore", invalid="ignore"):
            p = to_bf16(np.exp2((s - mn[:, :, None]).astype(F32))).astype(F32)
            alpha = to_bf16(np.exp2(np.maximum((m - mn).astype(F32), F32(-80.0)))).astype(F32)
        p = np.where(keep[None], p, F32(0.0))
        vt = to_bfp16ebs8(np.ascontiguousarray(vf[:, k0:k0 + lk].transpose(0, 2, 1))).astype(np.float64)
        pv = np.einsum("hqk,hdk->hqd", to_bfp16ebs8(p).astype(np.float64), vt).astype(F32)
        upd = live[None, :]
        acc = np.where(upd[:, :, None], (acc * alpha[:, :, None]).astype(F32) + pv, acc)
        l_ = np.where(upd, (alpha * l_).astype(F32) + p.sum(axis=2, dtype=F32), l_)
        m = np.where(upd, mn, m)
    with np.errstate(divide="ignore", invalid="ignore"):
        out = np.where(l_[:, :, None] > 0, acc / np.where(l_ > 0, l_, F32(1.0))[:, :, None], F32(0.0))
    out = out.reshape(kv_heads, group, rows, hd).transpose(2, 0, 1, 3).reshape(rows, heads * hd)
    return to_bf16(out.astype(F32))
