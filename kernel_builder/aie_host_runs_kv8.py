"""Host aie_api drivers (kernel_builder.aie_host_runs: `run(obj, rng)`) of the KV8 cache kernels: the writer
`kv_quant` (bit exact: the same power-of-two scale rule and RNE rounding as the reference) and the decode step over
KV8 items `attention_kv8` (the bf16 decode's bound: 2^-6 |ref| + 2^-8 max|ref|; its dequantization is exact). Rows
past the position hold random bytes (scales that are no power of two, NaN bits): the step must not read them."""
from __future__ import annotations

import numpy as np

from kernel_builder import aie_host
from kernel_builder import reference as ref
from kernel_builder.aie_host import Run
from kernel_builder.attention_kv8.external import SCALE_PAIR, attention_kv8_kernels
from kernel_builder.kv_quant.external import kv_quant_kernel
from kernel_builder.kv_quant.reference import dequantize, quantize
from kernel_builder.numerics import BF16, to_bf16

A = aie_host.aligned


def kv_rows_input(rng, rows: int, heads: int, hd: int) -> np.ndarray:
    """bf16 rows whose heads span magnitudes 2^-8 .. 2^8 (and one all-zero head when there are several)."""
    mag = np.exp2(rng.integers(-8, 9, size=heads)).astype(np.float32)
    if heads > 1:
        mag[-1] = 0.0
    return to_bf16(rng.standard_normal((rows, heads, hd)).astype(np.float32) * mag[None, :, None]).reshape(rows, -1)


def _kv_quant(lib, rng, rows, heads, hd):
    k = kv_quant_kernel(rows, heads, hd)
    x = kv_rows_input(rng, rows, heads, hd)
    codes, scales = A(np.zeros(rows * heads * hd, np.int8)), A(np.zeros(rows * heads * 4, np.int8))
    counts = lib.call(k.symbol, A(np.ascontiguousarray(x)), codes, scales)
    wc, ws = quantize(x, heads, hd)
    got = np.concatenate([codes.astype(np.float64), scales.view(np.float32).astype(np.float64)])
    want = np.concatenate([wc.reshape(-1).astype(np.float64), ws.reshape(-1).astype(np.float64)])
    return Run(got, want, np.zeros_like(want), counts)


def kv8_item(kc, vc, ks, vs, q, r0: int, lk: int) -> np.ndarray:
    """One core item of keys [r0, r0 + lk) of one kv head: per key its block (K codes, V codes, K scale, V scale),
    then the query rows."""
    pairs = np.stack([ks[r0:r0 + lk], vs[r0:r0 + lk]], axis=1).astype(np.float32).view(np.int8)
    assert pairs.shape == (lk, SCALE_PAIR)
    blocks = np.concatenate([kc[r0:r0 + lk], vc[r0:r0 + lk], pairs], axis=1)
    return np.concatenate([blocks.reshape(-1), np.ascontiguousarray(q, dtype=BF16).view(np.int8).reshape(-1)])


def _attention_kv8(lib, rng, hd, lq, lk, parts, window=None, scale_dim=None, pos=None):
    ks_ = attention_kv8_kernels(hd, lq, lk, parts, window, scale_dim)
    kv_rows = 2 * lk * parts
    pos = kv_rows - lk // 2 - 1 if pos is None else pos
    k, v = kv_rows_input(rng, kv_rows, 1, hd), kv_rows_input(rng, kv_rows, 1, hd)
    q = to_bf16(rng.standard_normal((lq, hd)).astype(np.float32) * np.float32(1.5))
    (kc, ks), (vc, vs) = quantize(k, 1, hd), quantize(v, 1, hd)
    ks, vs = ks.reshape(-1).copy(), vs.reshape(-1).copy()
    junk = rng.integers(-128, 128, size=(kv_rows - pos - 1, hd), dtype=np.int8)
    kc, vc = kc.copy(), vc.copy()
    kc[pos + 1:], vc[pos + 1:] = junk, junk
    ks[pos + 1:], vs[pos + 1:] = np.float32(np.nan), np.float32(3.0)
    share, states, counts = kv_rows // parts, [], None
    for s in range(parts):
        st = A(np.empty(lq * (hd + 2), np.float32))
        lib.call(ks_.init.symbol, st)
        for t in range(share // lk):
            r0 = s * share + t * lk
            c = lib.call(ks_.update.symbol, A(kv8_item(kc, vc, ks, vs, q, r0, lk)), st, pos, r0)
            counts = counts or c
        states.append(st)
    out = A(np.empty((lq, hd), BF16))
    lib.call(ks_.out.symbol, A(np.concatenate(states)), out)
    n = pos + 1
    kd, vd = np.zeros((kv_rows, hd), np.float32), np.zeros((kv_rows, hd), np.float32)
    kd[:n], vd[:n] = dequantize(kc[:n], ks[:n], 1, hd), dequantize(vc[:n], vs[:n], 1, hd)
    want = ref.attention(q.reshape(1, -1), kd, vd, pos, rows=1, kv_rows=kv_rows, heads=lq, kv_heads=1, head_dim=hd,
                         window=window, scale_dim=scale_dim).reshape(lq, hd)
    w = np.abs(want.astype(np.float64))
    return Run(out, want, w * 2.0**-6 + w.max() * 2.0**-8, counts)


def _kv_dequant(lib, rng, rows, heads, hd):
    from kernel_builder.kv_dequant.external import kv_dequant_kernel
    from kernel_builder.kv_quant.reference import pack_rows, split_rows
    k = kv_dequant_kernel(rows, heads, hd)
    packed = pack_rows(kv_rows_input(rng, rows, heads, hd), kv_rows_input(rng, rows, heads, hd), heads, hd)
    w = heads * hd
    kc, vc, ks, vs = split_rows(packed, heads, hd)
    ko, vo = A(np.zeros(rows * w, BF16)), A(np.zeros(rows * w, BF16))
    counts = lib.call(k.symbol, A(np.ascontiguousarray(packed)), ko, vo)
    want = np.concatenate([dequantize(kc, ks, heads, hd).reshape(-1), dequantize(vc, vs, heads, hd).reshape(-1)])
    return Run(np.concatenate([ko, vo]).astype(np.float32), want, np.zeros_like(want), counts)
