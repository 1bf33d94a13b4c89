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


def gemv_model(k: int, tm: int):
    def mv(w, x, y):
        wf = _need(w, "w", tm * k).reshape(tm, k).astype(F32)
        xf = _need(x, "x", k).astype(F32)
        out = _need(y, "y", tm)
        # cumsum over float32 accumulates sequentially: the host C++ loop's order, bit for bit.
        out[:] = _to_bf16(np.cumsum(wf * xf, axis=1, dtype=F32)[:, -1])
        y.written = True
    return mv


def rope_model(hd: int, heads: int | None):
    half = hd // 2

    def rope(x, lut, y, n_heads):
        n = int(n_heads)
        if heads is not None and n != heads:
            raise ModelError(f"called with n_heads={n}, symbol is for {heads} heads per call")
        if x.data.size < n * hd or y.data.size < n * hd:
            raise ModelError(f"x/y hold {x.data.size}/{y.data.size} elements, n_heads={n} needs {n * hd}")
        xf = x.data[:n * hd].astype(F32).reshape(n, hd)
        lf = _need(lut, "lut", hd).astype(F32)
        c, s = lf[:half], lf[half:]
        x1, x2 = xf[:, :half], xf[:, half:]
        out = np.empty((n, hd), dtype=F32)
        out[:, :half] = x1 * c - x2 * s  # products exact in f32; one f32 add then one RNE
        out[:, half:] = x2 * c + x1 * s
        y.data[:n * hd] = _to_bf16(out).reshape(-1)
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
        if t < n_q:      # Q item t is the tile of core slot t: rows [0, lk) then rows [lq - lk, lq)
            if t == slot:
                qd[:lk] = data[:lk]
                qd[lk:] = data[2 * lk - (lq - lk):]
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
