"""numpy models of the external C++ kernels' scalar paths, used by the interpreting emulator (emu-interp).

Each model mirrors `external_kernels/<family>.cc`'s portable path (f32 math in the same
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
        xs = _need(x, "x", k)
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
        s = _seq_sum(wf * xs[c0:c0 + kc].astype(F32), init)
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


def attention_model(mode: str, part: str, hd: int, lq: int, lk: int, n_parts: int | None):
    """attention.cc (kernels/attention.py): prefill (mode "p": init / item / finish) and decode (mode "d": init /
    step / merge) primitives on the f32 state acc[lq*hd] | m[lq] | l[lq]."""
    scale = F32(attention_scale(hd))
    n_state = lq * (hd + 2)

    def parts_of(state):
        data = _need(state, "state", n_state, "f32")
        return data[:lq * hd].reshape(lq, hd), data[lq * hd:lq * hd + lq], data[lq * hd + lq:]

    def reset(state):
        acc, m, l_ = parts_of(state)
        acc[:] = 0.0
        m[:] = _LOWEST
        l_[:] = 0.0
        state.written = True

    def init(state, q=None):
        reset(state)
        if mode == "p":          # prefill: init(state, q) also zeroes the query tile
            if q is None:
                raise ModelError("prefill init takes (state, q)")
            _need(q, "q", lq * hd)[:] = 0
            q.written = True
        elif q is not None:
            raise ModelError("decode init takes (state)")

    def update(k, v, q, state, q_pos0: int, q_step: int, k_pos0: int):
        acc, m, l_ = parts_of(state)
        qpos = q_pos0 + q_step * np.arange(lq)
        vis = np.clip(qpos - k_pos0 + 1, 0, lk)                       # visible keys: a prefix per row
        rows = vis > 0
        if not rows.any():
            return
        keep = np.arange(lk)[None, :] < vis[:, None]                   # [lq, lk]
        qf, kf, vf = q.astype(F32), k.astype(F32), v.astype(F32)
        with np.errstate(all="ignore"):                                # masked keys may hold anything
            # dot products accumulated over d sequentially in f32 (the host loop's order)
            s = np.cumsum(qf[:, None, :] * kf[None, :, :], axis=2, dtype=F32)[:, :, -1] * scale
            row_max = np.where(keep, s, _LOWEST).max(axis=1)
            m_new = np.where(m > row_max, m, row_max).astype(F32)
            alpha = np.exp(m - m_new).astype(F32)
            p = np.where(keep, np.exp(s - m_new[:, None]), F32(0.0)).astype(F32)
        new_acc = acc * alpha[:, None]
        total = np.zeros(lq, dtype=F32)
        for j in range(lk):  # sequential over keys, as in the host loop; masked keys are skipped
            kj = keep[:, j]
            total[kj] += p[kj, j]
            new_acc[kj] += p[kj, j, None] * vf[j][None, :]
        acc[rows] = new_acc[rows]
        l_[rows] = (alpha * l_ + total)[rows]
        m[rows] = m_new[rows]
        state.written = True

    def item(it, q, state, t, n_q, slot, q_pos0):
        t, n_q, slot, q_pos0 = int(t), int(n_q), int(slot), int(q_pos0)
        data = _need(it, "item", 2 * lk * hd).reshape(2 * lk, hd)
        qd = _need(q, "q", lq * hd).reshape(lq, hd)
        if t < n_q:      # slot = 2 * (the item holding this core's Q tile) + (the half it starts in)
            if t == slot >> 1:
                half = slot & 1
                if half and lq != lk:
                    raise ModelError(f"attention item: slot {slot} starts a Q tile of {lq} rows in the second "
                                     f"half of an item of 2x{lk} rows")
                qd[:lk] = data[half * lk:half * lk + lk]          # rows [0, lk)
                qd[lk:] = data[2 * lk - (lq - lk):]               # rows [lk, lq) (none when lq == lk)
                q.written = True
            return
        update(data[:lk], data[lk:], qd, state, q_pos0, 1, (t - n_q) * lk)

    def step(it, state, pos, k_pos0):
        data = _need(it, "item", (2 * lk + lq) * hd).reshape(2 * lk + lq, hd)
        update(data[:lk], data[lk:2 * lk], data[2 * lk:], state, int(pos), 0, int(k_pos0))

    def finish(state, out):
        acc, _, l_ = parts_of(state)
        with np.errstate(divide="ignore", invalid="ignore"):
            o = np.where(l_[:, None] > 0, acc / np.where(l_ > 0, l_, F32(1.0))[:, None], F32(0.0))
        _need(out, "out", lq * hd)[:] = _to_bf16(o).reshape(-1)
        out.written = True
        reset(state)             # ready for the next query block

    def merge(parts, out):
        data = _need(parts, "parts", n_parts * n_state, "f32").reshape(n_parts, n_state)
        acc = data[:, :lq * hd].reshape(n_parts, lq, hd)
        m, l_ = data[:, lq * hd:lq * hd + lq], data[:, lq * hd + lq:]
        mx = np.full(lq, _LOWEST, dtype=F32)
        for s in range(n_parts):
            mx = np.where(m[s] > mx, m[s], mx)
        w = np.exp(m - mx[None, :]).astype(F32)                        # [n_parts, lq]
        total = np.zeros(lq, dtype=F32)
        o = np.zeros((lq, hd), dtype=F32)
        for s in range(n_parts):                                      # sequential over parts (host order)
            total += w[s] * l_[s]
        for s in range(n_parts):
            o += w[s][:, None] * acc[s]
        with np.errstate(divide="ignore", invalid="ignore"):
            res = np.where(total[:, None] > 0, o / np.where(total > 0, total, F32(1.0))[:, None], F32(0.0))
        _need(out, "out", lq * hd)[:] = _to_bf16(res).reshape(-1)
        out.written = True

    table = {("p", "init"): init, ("p", "item"): item, ("p", "finish"): finish,
             ("d", "init"): init, ("d", "step"): step, ("d", "merge"): merge}
    if (mode, part) not in table:
        raise ModelError(f"attention: no {part!r} primitive in mode {mode!r}")
    return table[(mode, part)]


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
