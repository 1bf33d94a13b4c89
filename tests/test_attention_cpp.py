"""The attention tile primitives (external_kernels/attention.cc), scalar host path compiled with
g++, against kernel_builder.reference.attention, driven with the schedules the builder emits
(kernel_builder/attention/builder.py): prefill items (Q capture, then the whole K/V window, static), decode
shares of the window merged into one output. The numpy model the interpreter runs
(kernel_builder.external_models.attention_model) must agree with the compiled code.

Tolerance: the host path accumulates q.k and p.V in f32 in key order (the reference: f64), so outputs differ by
rounding only: |c - ref| <= 2^-7 |ref| + 2^-10 max|ref| (two bf16 ulps at the element, plus slack).
"""
from __future__ import annotations

import ctypes
import subprocess
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from tooling import require_tool

from external_kernels import compile_rules
from kernel_builder import reference as ref
from kernel_builder.attention import external as attention_ext
from kernel_builder.attention.external import attention_model
from kernel_builder.numerics import BF16, to_bf16

PREFILL = [(64, 64, 32, 1), (64, 32, 32, 2), (128, 16, 16, 4), (128, 24, 16, 2)]   # head_dim, lq, lk, qcycle
DECODE = [(64, 4, 32, 4), (32, 3, 16, 2)]        # head_dim, group rows, lk, parts


def _kernels():
    return ([attention_ext.attention_prefill_kernels(*c[:3], qcycle=c[3]) for c in PREFILL]
            + [attention_ext.attention_decode_kernels(*c) for c in DECODE])


@pytest.fixture(scope="module")
def lib(tmp_path_factory) -> ctypes.CDLL:
    cxx = require_tool("g++")
    out = tmp_path_factory.mktemp("attention_host")
    cmds = [compile_rules.host_compile_command(k.init, out, cxx=cxx) + ["-Wall", "-Wextra"] for k in _kernels()]
    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(lambda c: subprocess.run(c, capture_output=True, text=True), cmds))
    for cmd, res in zip(cmds, results):
        assert res.returncode == 0, f"{' '.join(cmd)}\n{res.stderr}"
        assert "warning" not in res.stderr, res.stderr
    so = out / "libattention.so"
    objects = [out / compile_rules.host_object_name(k.init) for k in _kernels()]
    subprocess.run(compile_rules.host_link_command(objects, so, cxx=cxx),
                   check=True)
    return ctypes.CDLL(str(so))


@pytest.fixture
def rng():
    return np.random.default_rng(11)


def _ptr(a: np.ndarray) -> ctypes.c_void_p:
    assert a.flags.c_contiguous
    return a.ctypes.data_as(ctypes.c_void_p)


def _fn(lib, symbol: str, n_ptrs: int, n_ints: int = 0):
    f = getattr(lib, symbol)
    f.argtypes = [ctypes.c_void_p] * n_ptrs + [ctypes.c_int32] * n_ints
    f.restype = None
    return f


def _rand(rng, shape, scale=1.0) -> np.ndarray:
    return to_bf16(rng.standard_normal(shape).astype(np.float32) * np.float32(scale))


def _assert_close(got, want, what):
    g, w = got.astype(np.float64), want.astype(np.float64)
    bound = 2.0**-7 * np.abs(w) + 2.0**-10 * np.abs(w).max()
    err = np.abs(g - w)
    assert np.isfinite(g).all(), f"{what}: non-finite output"
    assert np.all(err <= bound), f"{what}: max err {err.max()}"


def _block(x: np.ndarray) -> np.ndarray:
    """[rows, cols] -> 8x8 blocks, each row-major (the L1 layout the builder's memory-tile put makes)."""
    r, c = x.shape
    return np.ascontiguousarray(x.reshape(r // 8, 8, c // 8, 8).transpose(0, 2, 1, 3)).reshape(r, c)


class Prefill:
    """One core's schedule (kernel_builder/attention/builder.py): init, the Q stream (each head's qcycle * lq rows of
    the round, padded to whole items of 2 lk rows, head-major), then the K/V items of the window; every item
    8x8-blocked. Core (x, y) keeps head y's 8-row blocks x, x + qcycle, ...: slot = y * (blocks per head) + x."""

    def __init__(self, lib, hd, lq, lk, qcycle):
        ks = attention_ext.attention_prefill_kernels(hd, lq, lk, qcycle=qcycle)
        self.hd, self.lq, self.lk, self.qcycle = hd, lq, lk, qcycle
        self.init, self.item, self.finish = _fn(lib, ks.init.symbol, 2), _fn(lib, ks.update.symbol, 3, 4), \
            _fn(lib, ks.out.symbol, 2)

    def rows_of(self, x):
        """The round's rows core x computes (its interleaved 8-row blocks)."""
        return np.array([(x + i * self.qcycle) * 8 + r for i in range(self.lq // 8) for r in range(8)])

    def q_items(self, span):
        hd, lk = self.hd, self.lk
        per_head = -(-len(span) // (2 * lk))
        pad = np.zeros((per_head * 2 * lk - len(span), hd), BF16)
        stream = np.concatenate([np.concatenate([span[:, y * hd:(y + 1) * hd], pad])
                                 for y in range(span.shape[1] // hd)])
        return [_block(stream[i:i + 2 * lk]) for i in range(0, len(stream), 2 * lk)], per_head * 2 * lk // 8

    def run(self, span, x, y, k, v, pos, state=None, q=None):
        """span: the round's Q rows [qcycle * lq, heads * hd] at pos; this core is (x, y). state/q: reuse the
        buffers of an earlier round (finish empties the state) instead of a fresh init."""
        hd, lq, lk = self.hd, self.lq, self.lk
        if state is None:
            state, q = np.empty(lq * (hd + 2), np.float32), np.empty((lq, hd), BF16)
            self.init(_ptr(state), _ptr(q))
        items, per_head = self.q_items(span)
        n_q, slot, q_pos0 = len(items), y * per_head + x, pos + 8 * x
        for t, it in enumerate(items):
            self.item(_ptr(it), _ptr(q), _ptr(state), t, n_q, slot, q_pos0)
        for t in range(k.shape[0] // lk):
            it = _block(np.concatenate([k[t * lk:(t + 1) * lk], v[t * lk:(t + 1) * lk]]))
            self.item(_ptr(it), _ptr(q), _ptr(state), n_q + t, n_q, slot, q_pos0)
        self.finish(_ptr(state), _ptr(q))
        return q.copy(), state, q


@pytest.mark.parametrize("cfg", PREFILL, ids=lambda c: f"hd{c[0]}_q{c[1]}_k{c[2]}_n{c[3]}")
@pytest.mark.parametrize("pos", [0, 40, 77])
def test_prefill_schedule_matches_reference(lib, rng, cfg, pos):
    """qcycle interleaved cores x three heads share a stream; each one's output is the reference's rows for its
    blocks and head. Rounds follow each other on the same buffers (finish leaves an empty state). Keys past the
    last query hold NaN/inf (a KV window beyond the chunk): never read."""
    p = Prefill(lib, *cfg)
    hd, lq, span = p.hd, p.lq, p.qcycle * p.lq
    rows, heads = 2 * span, 3
    window = -(-(8 * p.lk + rows + pos) // p.lk) * p.lk
    q = _rand(rng, (rows, heads * hd), 1.5)
    k, v = _rand(rng, (window, hd), 1.5), _rand(rng, (window, hd))
    k[pos + rows:], v[pos + rows:] = np.inf, np.nan
    want = ref.attention(q, k, v, pos, rows=rows, kv_rows=window, heads=heads, kv_heads=1, head_dim=hd)
    for y in range(heads):
        for x in range(p.qcycle):
            state = buf = None
            for rd in range(2):
                got, state, buf = p.run(q[rd * span:(rd + 1) * span], x, y, k, v, pos + rd * span, state, buf)
                rows_x = rd * span + p.rows_of(x)
                _assert_close(got, want[rows_x, y * hd:(y + 1) * hd], f"pos {pos} round {rd} core {x} head {y}")


def test_numpy_model_agrees_with_compiled_prefill(lib, rng):
    """The interpreter's model of the prefill item (blocked items, interleaved blocks) gives the compiled state."""
    hd, lq, lk, qcycle = PREFILL[1]
    p = Prefill(lib, hd, lq, lk, qcycle)
    span, pos = qcycle * lq, 21
    window = -(-(span + pos) // lk) * lk
    q = _rand(rng, (span, 2 * hd), 1.5)
    k, v = _rand(rng, (window, hd), 1.5), _rand(rng, (window, hd))
    _, state, _ = p.run(q, 1, 1, k, v, pos)   # finish empties the state: compare the output instead
    init, item, finish = (attention_model("p", part, hd, lq, lk, qcycle) for part in ("init", "item", "finish"))
    st, qb = _Buf(np.empty(lq * (hd + 2), np.float32), "f32"), _Buf(np.empty(lq * hd, BF16), "bf16")
    init(st, qb)
    items, per_head = p.q_items(q)
    for t, it in enumerate(items):
        item(_Buf(it.copy(), "bf16"), qb, st, t, len(items), per_head + 1, pos + 8)
    for t in range(window // lk):
        it = _block(np.concatenate([k[t * lk:(t + 1) * lk], v[t * lk:(t + 1) * lk]]))
        item(_Buf(it, "bf16"), qb, st, len(items) + t, len(items), per_head + 1, pos + 8)
    out = _Buf(np.empty(lq * hd, BF16), "bf16")
    finish(st, out)
    got, _, _ = p.run(q, 1, 1, k, v, pos)
    ulps = np.abs(out.data.view(np.int16).astype(np.int32) - got.reshape(-1).view(np.int16).astype(np.int32))
    assert ulps.max() <= 1 and np.mean(ulps == 0) > 0.95


def test_prefill_init_and_finish_leave_an_empty_state(lib, rng):
    p = Prefill(lib, *PREFILL[0])
    hd, lq, lk = p.hd, p.lq, p.lk
    state, q = np.full(lq * (hd + 2), 7.0, np.float32), _rand(rng, (lq, hd))
    p.init(_ptr(state), _ptr(q))
    empty = state.copy()
    np.testing.assert_array_equal(q.astype(np.float32), 0.0)
    assert np.all(empty[:lq * hd] == 0) and np.all(empty[lq * hd + lq:] == 0) and np.all(empty[lq * hd:lq * hd + lq] < -1e38)
    out = np.ones((lq, hd), BF16)
    p.finish(_ptr(state), _ptr(out))                   # nothing seen: l == 0 -> zeros, not NaN
    np.testing.assert_array_equal(out.astype(np.float32), 0.0)
    item = _rand(rng, (2 * lk, hd))
    p.item(_ptr(item), _ptr(q), _ptr(state), 1, 1, 0, 5)    # keys 0..lk-1 for queries at 5..
    assert not np.array_equal(state, empty)
    p.finish(_ptr(state), _ptr(out))
    np.testing.assert_array_equal(state, empty)


def test_prefill_tile_past_the_queries_leaves_state_unchanged(lib, rng):
    p = Prefill(lib, *PREFILL[0])
    hd, lq, lk = p.hd, p.lq, p.lk
    state, q = np.empty(lq * (hd + 2), np.float32), np.empty((lq, hd), BF16)
    p.init(_ptr(state), _ptr(q))
    q[:] = _rand(rng, (lq, hd))
    item = _rand(rng, (2 * lk, hd))
    p.item(_ptr(item), _ptr(q), _ptr(state), 1, 1, 0, 5)   # keys 0..lk-1 for queries at 5..: row 0 sees 6 keys
    before = state.copy()
    far = _rand(rng, (2 * lk, hd))
    p.item(_ptr(far), _ptr(q), _ptr(state), 1 + (5 + lq) // lk + 1, 1, 0, 5)   # a tile after every query
    np.testing.assert_array_equal(state, before)


class Decode:
    def __init__(self, lib, hd, g, lk, parts):
        ks = attention_ext.attention_decode_kernels(hd, g, lk, parts)
        self.hd, self.g, self.lk, self.parts = hd, g, lk, parts
        self.init, self.step, self.merge = _fn(lib, ks.init.symbol, 1), _fn(lib, ks.update.symbol, 2, 2), \
            _fn(lib, ks.out.symbol, 2)

    def run(self, q_rows, k, v, pos):
        """The window split into `parts` shares, each folded into a partial, then merged."""
        hd, g, lk, n = self.hd, self.g, self.lk, self.parts
        share = k.shape[0] // n
        states = np.empty((n, g * (hd + 2)), np.float32)
        for s in range(n):
            self.init(_ptr(states[s]))
            for t in range(share // lk):
                r0 = s * share + t * lk
                item = np.ascontiguousarray(np.concatenate([k[r0:r0 + lk], v[r0:r0 + lk], q_rows]))
                self.step(_ptr(item), _ptr(states[s]), pos, r0)
        out = np.empty((g, hd), BF16)
        self.merge(_ptr(states), _ptr(out))
        return out, states


@pytest.mark.parametrize("cfg", DECODE, ids=lambda c: f"hd{c[0]}_g{c[1]}_k{c[2]}_n{c[3]}")
def test_decode_shares_merge_to_reference(lib, rng, cfg):
    d = Decode(lib, *cfg)
    window = 8 * d.lk * d.parts
    k, v = _rand(rng, (window, d.hd), 1.5), _rand(rng, (window, d.hd))
    for pos in (0, 1, 63, 64, 65, window // 2 + 3, window - 1):
        q = _rand(rng, (1, d.g * d.hd), 1.5)
        kk, vv = k.copy(), v.copy()
        kk[pos + 1:], vv[pos + 1:] = np.nan, np.inf         # past the position: never read
        got, _ = d.run(q.reshape(d.g, d.hd), kk, vv, pos)
        want = ref.attention(q, kk, vv, pos, rows=1, kv_rows=window, heads=d.g, kv_heads=1, head_dim=d.hd)
        _assert_close(got.reshape(1, -1), want, f"pos {pos}")


class _Buf:
    """The interpreter's memref stand-in for calling the numpy model directly."""

    def __init__(self, data: np.ndarray, dtype: str):
        self.data, self.dtype, self.written = data.reshape(-1), dtype, False


@pytest.mark.parametrize("cfg", DECODE, ids=lambda c: f"hd{c[0]}_g{c[1]}_k{c[2]}_n{c[3]}")
def test_numpy_model_agrees_with_compiled_decode(lib, rng, cfg):
    """The interpreter's model of the same schedule gives the compiled partials (f32; numpy's exp and glibc's
    expf may differ in the last bit, which the running rescaling carries into the sums) and, merging the
    compiled partials, the compiled bf16 output within one ulp."""
    d = Decode(lib, *cfg)
    hd, g, lk, n = d.hd, d.g, d.lk, d.parts
    window, pos = 4 * lk * n, 3 * lk * n - 5
    k, v, q = _rand(rng, (window, hd)), _rand(rng, (window, hd)), _rand(rng, (g, hd))
    got, states = d.run(q, k, v, pos)
    init, step, merge = (attention_model("d", part, hd, g, lk, n) for part in ("init", "step", "merge"))
    share = window // n
    model_states = np.empty_like(states)
    for s in range(n):
        st = _Buf(model_states[s], "f32")
        init(st)
        for t in range(share // lk):
            r0 = s * share + t * lk
            step(_Buf(np.concatenate([k[r0:r0 + lk], v[r0:r0 + lk], q]), "bf16"), st, np.int32(pos), r0)
    np.testing.assert_allclose(model_states, states, rtol=1e-5, atol=1e-5 * np.abs(states).max())
    out = np.empty(g * hd, BF16)
    merge(_Buf(states, "f32"), _Buf(out, "bf16"))
    ulps = np.abs(out.view(np.int16).astype(np.int32) - got.reshape(-1).view(np.int16).astype(np.int32))
    assert ulps.max() <= 1 and np.mean(ulps == 0) > 0.95
