"""numpy models of the external C++ kernels' scalar paths, used by the interpreting emulator (emu-interp).

Each model mirrors `kernel_builder/external_kernels/<family>.cc`'s portable path (f32 math in the same
order, one RNE bf16 store), so the interpreter gives what a host-compiled kernel gives. Arguments are the
interpreter's MemRefs (`.data`: a flat array, `.dtype`: element type name, `.written`). Which symbol maps
to which model is the family table in kernel_builder/externals.py.
"""
from __future__ import annotations

import numpy as np

from kernel_builder.numerics import BF16
from kernel_builder.reference import attention_scale

F32 = np.float32


class ModelError(ValueError):
    """A call whose arguments do not match the kernel (the interpreter names the call site)."""


def _need(mr, name: str, size: int, dtype: str = "bf16") -> np.ndarray:
    if not hasattr(mr, "data"):
        raise ModelError(f"argument {name} must be a memref")
    if mr.data.size != size or mr.dtype != dtype:
        raise ModelError(f"argument {name} is {mr.data.size}x{mr.dtype}, the kernel expects {size}x{dtype}")
    return mr.data


def _to_bf16(x) -> np.ndarray:
    return np.asarray(x, dtype=F32).astype(BF16)


def _seq_sum(products: np.ndarray, init: np.ndarray) -> np.ndarray:
    """Row sums accumulated left to right in f32 starting from `init` (the host C++ loop's order, bit for bit:
    cumsum over float32 adds sequentially)."""
    return np.cumsum(np.concatenate([init[:, None], products], axis=1), axis=1, dtype=F32)[:, -1]


def gemv_model(k: int, kc: int, tm: int, rows: int):
    def mv(w, x, acc, y, row, k0):
        wf = _need(w, "w", tm * kc).reshape(tm, kc).astype(F32)
        xf = _need(x, "x", kc).astype(F32)
        a = _need(acc, "acc", tm, "f32")
        out = _need(y, "y", rows)
        r, c0 = int(row), int(k0)
        if not (0 <= r and r + tm <= rows and r % tm == 0):
            raise ModelError(f"row offset {r} is not a tile_m={tm} block of the {rows} output rows")
        if not (0 <= c0 < k and c0 % kc == 0):
            raise ModelError(f"k offset {c0} is not a kc={kc} chunk of k={k}")
        if c0 > 0 and not acc.written:
            raise ModelError("a later K chunk reads the f32 partial sums before any chunk wrote them")
        init = np.zeros(tm, dtype=F32) if c0 == 0 else a.astype(F32)
        s = _seq_sum(wf * xf, init)
        if c0 + kc >= k:
            out[r:r + tm] = _to_bf16(s)
            y.written = True
        else:
            a[:] = s
            acc.written = True
    return mv


def rmsnorm_model(g: int, units: int):
    inv_g = F32(1.0) / F32(g)

    def rms(x, w, y, eps):
        xf = _need(x, "x", units * g).reshape(units, g).astype(F32)
        wf = _need(w, "w", g).astype(F32)
        ss = _seq_sum(xf * xf, np.zeros(units, dtype=F32))
        ms = (ss * inv_g).astype(F32) + F32(eps)
        r = F32(1.0) / np.sqrt(ms, dtype=F32)
        _need(y, "y", units * g)[:] = _to_bf16((xf * r[:, None]) * wf).reshape(-1)
        y.written = True
    return rms


def add_model(n: int):
    def add(a, b, y):
        s = _need(a, "a", n).astype(F32) + _need(b, "b", n).astype(F32)
        _need(y, "y", n)[:] = _to_bf16(s)
        y.written = True
    return add


def rope_model(hd: int, heads: int, rows: int):
    half = hd // 2

    def rope(x, lut, y):
        xf = _need(x, "x", rows * heads * hd).astype(F32).reshape(rows, heads, hd)
        lf = _need(lut, "lut", rows * hd).astype(F32).reshape(rows, 1, hd)
        c, s = lf[..., :half], lf[..., half:]
        x1, x2 = xf[..., :half], xf[..., half:]
        out = np.empty((rows, heads, hd), dtype=F32)
        out[..., :half] = x1 * c - x2 * s  # products exact in f32; one f32 add then one RNE
        out[..., half:] = x2 * c + x1 * s
        _need(y, "y", rows * heads * hd)[:] = _to_bf16(out).reshape(-1)
        y.written = True
    return rope


def swiglu_model(n: int):
    def swiglu(gate, up, y):
        g = _need(gate, "gate", n).astype(F32)
        u = _need(up, "up", n).astype(F32)
        with np.errstate(over="ignore"):
            silu = g / (F32(1.0) + np.exp(-g))
        _need(y, "y", n)[:] = _to_bf16(silu * u)
        y.written = True
    return swiglu


_LOWEST = np.finfo(F32).min  # -0x1.fffffep127f, "no key seen yet"


def attention_model(part: str, hd: int, lq: int, lk: int):
    scale = F32(attention_scale(hd))

    def init(m, l_, acc):
        _need(m, "m", lq, "f32")[:] = _LOWEST
        _need(l_, "l", lq, "f32")[:] = 0.0
        _need(acc, "acc", lq * hd, "f32")[:] = 0.0
        for b in (m, l_, acc):
            b.written = True

    def step(q, k, v, m, l_, acc, q_pos0, k_pos0, causal):
        qf = _need(q, "q", lq * hd).reshape(lq, hd).astype(F32)
        kf = _need(k, "k", lk * hd).reshape(lk, hd).astype(F32)
        vf = _need(v, "v", lk * hd).reshape(lk, hd).astype(F32)
        mm, ll = _need(m, "m", lq, "f32"), _need(l_, "l", lq, "f32")
        aa = _need(acc, "acc", lq * hd, "f32").reshape(lq, hd)
        # dot products accumulated over d sequentially in f32 (the host loop's order)
        s = np.cumsum(qf[:, None, :] * kf[None, :, :], axis=2, dtype=F32)[:, :, -1] * scale
        qpos = int(q_pos0) + np.arange(lq)[:, None]
        kpos = int(k_pos0) + np.arange(lk)[None, :]
        keep = (kpos <= qpos) if int(causal) else np.ones((lq, lk), dtype=bool)
        any_ = keep.any(axis=1)
        row_max = np.where(keep, s, _LOWEST).max(axis=1)
        m_new = np.where(mm > row_max, mm, row_max).astype(F32)
        alpha = np.exp(mm - m_new).astype(F32)
        with np.errstate(over="ignore", invalid="ignore"):
            p = np.where(keep, np.exp(s - m_new[:, None]), F32(0.0)).astype(F32)
        new_acc = aa * alpha[:, None]
        total = np.zeros(lq, dtype=F32)
        for j in range(lk):  # sequential over keys, as in the host loop; masked keys add 0
            total += p[:, j]
            new_acc += p[:, j:j + 1] * vf[j][None, :]
        new_l = alpha * ll + total
        rows = any_  # a row whose keys are all masked in this tile stays unchanged
        aa[rows] = new_acc[rows]
        ll[rows] = new_l[rows]
        mm[rows] = m_new[rows]
        for b in (m, l_, acc):
            b.written = True

    def finish(l_, acc, out):
        ll = _need(l_, "l", lq, "f32")
        aa = _need(acc, "acc", lq * hd, "f32").reshape(lq, hd)
        with np.errstate(divide="ignore", invalid="ignore"):
            o = np.where(ll[:, None] > 0, aa / np.where(ll > 0, ll, F32(1.0))[:, None], F32(0.0))
        _need(out, "out", lq * hd)[:] = _to_bf16(o).reshape(-1)
        out.written = True

    return {"init": init, "step": step, "finish": finish}[part]


def _unblock(x: np.ndarray, rows: int, cols: int) -> np.ndarray:
    """[rows/8][cols/8][8][8] blocks (each row-major) -> the [rows, cols] matrix."""
    return x.reshape(rows // 8, cols // 8, 8, 8).transpose(0, 2, 1, 3).reshape(rows, cols)


def _block(x: np.ndarray) -> np.ndarray:
    """The inverse of _unblock: a [rows, cols] matrix -> its flat 8x8-blocked layout."""
    rows, cols = x.shape
    return x.reshape(rows // 8, 8, cols // 8, 8).transpose(0, 2, 1, 3).reshape(-1)


def gemm_model(part: str, tm: int, tk: int, tn: int):
    """external_kernels/gemm.cc on its 8x8-blocked L1 tiles: zero / mac (acc += a . w^T) / out (bf16 RNE)."""

    def zero(acc):
        _need(acc, "acc", tm * tn, "f32")[:] = 0.0
        acc.written = True

    def mac(a, w, acc):
        af = _unblock(_need(a, "a", tm * tk), tm, tk).astype(F32)
        wf = _unblock(_need(w, "w", tn * tk), tn, tk).astype(F32)
        cf = _unblock(_need(acc, "acc", tm * tn, "f32"), tm, tn)
        # bf16 x bf16 products are exact in f32; the host loop adds them to acc one k at a time, in
        # ascending k: a float32 cumsum starting from acc is that order, bit for bit.
        terms = np.concatenate([cf[:, :, None], af[:, None, :] * wf[None, :, :]], axis=2)
        acc.data[:] = _block(np.cumsum(terms, axis=2, dtype=F32)[:, :, -1])
        acc.written = True

    def out(acc, c):
        _need(c, "c", tm * tn)[:] = _to_bf16(_need(acc, "acc", tm * tn, "f32"))
        c.written = True

    return {"zero": zero, "mac": mac, "out": out}[part]
