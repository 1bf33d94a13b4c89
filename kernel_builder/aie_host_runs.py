"""Drive each external kernel's AIE2P vector path (kernel_builder.aie_host) the way the builders call it, and
compute what the numpy reference says it must produce; `counts(obj)` gives the instruction counts of one call.

`run(obj, rng, lib=None)` -> Run(got, want, bound, counts): `bound` is the per-element tolerance (an array like
`want`), `counts` the instruction counts of one representative call of the compute entry point: one GEMV step
(tile_m rows x one K chunk), one GEMM mac (one K step of the tile), one prefill K/V item every query row sees
whole, one decode step with every key visible, one call of rope/rmsnorm/swiglu/add. The objects the builders link
for the reference models are listed in tests/test_aie_host_kernels.py (checked against the builders there).

Tolerances (why, per family):
- add, rope: the same f32 operations as the reference, one bf16 RNE rounding -> bit exact (bound 0).
- gemv: f32 accumulation in 2 x 32 interleaved lanes + a halving-tree reduce vs numpy's order: two bf16 ulps at the
  element plus 2^-10 max|ref| for cancellation (the scalar path's bound, tests/test_externals_cpp.py).
- rmsnorm: r = invsqrt as a bf16 pair (hi + lo) -> within one bf16 ulp: 2^-7 |ref|.
- swiglu, geglu: exp2 and inv in bf16 and two intermediate bf16 roundings -> 2^-6 |ref| + 2^-9 (about 2-4 bf16 ulps).
- gemm (block-float flag): against the block-float reference (both operands through numerics.to_bfp16ebs8, f64
  dot products): 2^-8 |ref| + 2^-12 max|ref| (one bf16 rounding, f32 accumulation of 8-term blocks); the bias
  epilogue likewise (the bias added in f64 before the rounding); the glu epilogue: swiglu's bound plus one bf16
  ulp of each of its two block-float inputs.
- attention: probabilities carry bf16 precision (exp2 returns bf16; P is a bf16 mmul operand), 1/l is a bf16
  reciprocal refined by one f32 Newton step: 2^-6 |ref| + 2^-8 max|ref|.
"""
from __future__ import annotations

import re

import numpy as np

from kernel_builder import aie_host
from kernel_builder import externals as ext
from kernel_builder import reference as ref
from kernel_builder.aie_host import Run
from kernel_builder.numerics import BF16, to_bf16, to_bfp16ebs8
from external_kernels.compile_rules import ExternalKernel
from kernel_builder.add.external import add_kernel
from kernel_builder.attention.external import attention_decode_kernels
from kernel_builder.attention.external import attention_prefill_kernels
from kernel_builder.geglu.external import geglu_kernel
from kernel_builder.gemm.external import gemm_kernels, scratch_elems
from kernel_builder.gemv.external import gemv_kernel
from kernel_builder.rmsnorm.external import rmsnorm_kernel
from kernel_builder.rope.external import rope_kernel
from kernel_builder.swiglu.external import swiglu_kernel
from kernel_builder.gemm_swiglu.layout import split as split_glu
from kernel_builder.bias_add.external import bias_add_kernel

A = aie_host.aligned


def rand(rng, shape, scale=1.0) -> np.ndarray:
    return to_bf16(rng.standard_normal(shape).astype(np.float32) * np.float32(scale))


def family(obj: str):
    for fam in ext.families():
        m = re.fullmatch(fam.object_re, obj)
        if m:
            return fam.name, ext._ints(m.groups())
    raise ValueError(f"no kernel family makes {obj}")


def kernel_of(obj: str) -> ExternalKernel:
    k = ext.kernel_for_object(obj)
    if k is None:
        raise ValueError(f"no kernel family makes {obj}")
    return k


def mismatch(r: Run) -> str:
    """'' when every element is within its bound, else a one-line description."""
    g, w = r.got.astype(np.float64), r.want.astype(np.float64)
    err = np.abs(g - w)
    bad = ~(err <= r.bound)   # NaN counts as bad
    if not bad.any():
        return ""
    i = int(np.argmax(np.where(bad, err - r.bound, -np.inf)))
    return f"{int(bad.sum())} of {bad.size} elements out of bound; worst at {i}: got {g.flat[i]}, want {w.flat[i]}"


def _close(want, rel, absolute=0.0):
    w = np.abs(want.astype(np.float64))
    return rel * w + absolute * (w.max() if w.size else 0.0)


# ------------------------------------------------------------------------------------------- elementwise
def _gemv(lib, rng, k, kc, tm, rows):
    sym = gemv_kernel(k, kc, tm, rows).symbol
    w, x = rand(rng, (rows, k), 0.03), A(rand(rng, (k,)))
    acc, y = A(np.full(tm, np.nan, np.float32)), A(np.zeros(rows, BF16))
    counts = None
    for r in range(0, rows, tm):
        for k0 in range(0, k, kc):
            c = lib.call(sym, A(w[r:r + tm, k0:k0 + kc]), x, acc, y, r, k0)
            counts = counts or c
    want = ref.gemv(w, x, m=rows, k=k).reshape(-1)
    return Run(y, want, _close(want, 2.0**-7, 2.0**-10), counts)


def _gemv_bias(lib, rng, k, kc, tm, rows):
    """The GEMV with its bias epilogue: b[rows] after x in x's buffer; the last K chunk adds b[row + m] before
    rounding."""
    sym = gemv_kernel(k, kc, tm, rows, bias=True).symbol
    w, x, b = rand(rng, (rows, k), 0.03), rand(rng, (k,)), rand(rng, (rows,))
    xb = A(np.concatenate([x, b]))
    acc, y = A(np.full(tm, np.nan, np.float32)), A(np.zeros(rows, BF16))
    counts = None
    for r in range(0, rows, tm):
        for k0 in range(0, k, kc):
            c = lib.call(sym, A(w[r:r + tm, k0:k0 + kc]), xb, acc, y, r, k0)
            counts = counts or c
    want = ref.gemv_bias(w, x, b, m=rows, k=k).reshape(-1)
    return Run(y, want, _close(want, 2.0**-7, 2.0**-10), counts)


def _rope(lib, rng, hd, heads, rows):
    sym = rope_kernel(hd, heads, rows).symbol
    x, lut = rand(rng, (rows, heads * hd)), to_bf16(rng.uniform(-1, 1, (rows, hd)).astype(np.float32))
    y = A(np.zeros((rows, heads * hd), BF16))
    counts = lib.call(sym, A(x), A(lut), y)
    want = ref.rope(x, lut, rows=rows, heads=heads, head_dim=hd)
    return Run(y, want, np.zeros(want.shape), counts)


def _rmsnorm(lib, rng, g, units, offset=None):
    sym = rmsnorm_kernel(g, units, offset).symbol
    x, w = rand(rng, (units, g), 2.0), rand(rng, (g,))
    y = A(np.zeros((units, g), BF16))
    counts = lib.call(sym, A(x), A(w), y, 1e-5)
    want = ref.rmsnorm(x, w, rows=units, dim=g, eps=1e-5, offset=offset or 0)
    return Run(y, want, _close(want, 2.0**-7), counts)


def _swiglu(lib, rng, n):
    sym = swiglu_kernel(n).symbol
    gate, up = rand(rng, (n,), 3.0), rand(rng, (n,))
    y = A(np.zeros(n, BF16))
    counts = lib.call(sym, A(gate), A(up), y)
    want = ref.swiglu(gate, up, rows=1, dim=n).reshape(-1)
    return Run(y, want, _close(want, 2.0**-6) + 2.0**-9, counts)


def _geglu(lib, rng, n):
    sym = geglu_kernel(n).symbol
    gate, up = rand(rng, (n,), 3.0), rand(rng, (n,))
    y = A(np.zeros(n, BF16))
    counts = lib.call(sym, A(gate), A(up), y)
    want = ref.geglu(gate, up, rows=1, dim=n).reshape(-1)
    return Run(y, want, _close(want, 2.0**-6) + 2.0**-9, counts)


def _add(lib, rng, n):
    sym = add_kernel(n).symbol
    a, b = rand(rng, (n,)), rand(rng, (n,))
    y = A(np.zeros(n, BF16))
    counts = lib.call(sym, A(a), A(b), y)
    want = ref.add(a, b, rows=1, dim=n).reshape(-1)
    return Run(y, want, np.zeros(want.shape), counts)


def _bias_add(lib, rng, n):
    sym = bias_add_kernel(n).symbol
    x, b = rand(rng, (n,)), rand(rng, (n,))
    y = A(np.zeros(n, BF16))
    counts = lib.call(sym, A(x), A(b), y)
    want = ref.bias_add(x, b, rows=1, dim=n).reshape(-1)
    return Run(y, want, np.zeros(want.shape), counts)


# ------------------------------------------------------------------------------------------------- GEMM
def block(x: np.ndarray) -> np.ndarray:
    """[R, C] -> 8x8 blocks, each row-major, blocks in row-major order (the L1 layout of external_kernels/gemm.cc)."""
    r, c = x.shape
    return np.ascontiguousarray(x.reshape(r // 8, 8, c // 8, 8).transpose(0, 2, 1, 3)).reshape(-1)


def unblock(x: np.ndarray, r: int, c: int) -> np.ndarray:
    return x.reshape(r // 8, c // 8, 8, 8).transpose(0, 2, 1, 3).reshape(r, c)


def gemm_bfp_reference(a: np.ndarray, w: np.ndarray) -> np.ndarray:
    """c = a . w^T with both operands in the block-float model along K (blocks of 8), exact dot products, one bf16
    rounding: what the AIE_API_EMULATE_BFLOAT16_MMUL_WITH_BFP16 path computes up to f32 accumulation order."""
    qa, qw = to_bfp16ebs8(a.astype(np.float32)), to_bfp16ebs8(w.astype(np.float32))
    return to_bf16(qa.astype(np.float64) @ qw.astype(np.float64).T)


def _gemm_acc(lib, ks, a, w, tk, steps):
    """zero + `steps` mac calls on a fresh accumulator (2*tm*tn bf16 = the f32 bytes); returns it and the first
    mac's counts. The W tiles: bf16 8x8 blocks, or (gemm_bfp's object) the L1 tiles of block_float.encode(w)."""
    acc = A(np.full(2 * a.shape[0] * w.shape[0], np.nan, BF16))
    scratch = A(np.full(scratch_elems(a.shape[0], tk), np.nan, BF16))
    lib.call(ks.zero.symbol, acc)
    counts = None
    wb = None
    if ks.obj.startswith("gemm_bfp_"):
        from kernel_builder import block_float
        from kernel_builder.gemm_bfp.external import w_tile
        wb = block_float.encode(w)
    for s in range(steps):
        sl = slice(s * tk, (s + 1) * tk)
        wt = block(w[:, sl]) if wb is None else w_tile(wb, tk, s)
        c = lib.call(ks.mac.symbol, A(block(a[:, sl])), A(wt), acc, scratch)
        counts = counts or c
    return acc, counts


def _gemm(lib, rng, tm, tk, tn, steps=2, w_format="bf16"):
    """The three epilogues on one tile, each on its own accumulator: out (bf16 in place), glu (the tile's column
    blocks in (gate, up) pairs: silu(gate) * up in place, [tm, tn/2]) and bias (acc + b[col]); got/want concatenated.
    w_format "bfp16": gemm_bfp.cc's object, its mac fed the encoded weight (the same block-float model)."""
    ks = gemm_kernels(tm, tk, tn, w_format)
    a, w = rand(rng, (tm, steps * tk)), rand(rng, (tn, steps * tk))
    acc, counts = _gemm_acc(lib, ks, a, w, tk, steps)
    lib.call(ks.out.symbol, acc)
    # the block-float path's products are per 8-element K block: the reference quantizes the same blocks
    want = gemm_bfp_reference(a, w)
    got = [unblock(acc[:tm * tn], tm, tn)]
    bounds = [_close(want, 2.0**-8, 2.0**-12)]
    wants = [want]
    acc, _ = _gemm_acc(lib, ks, a, w, tk, steps)
    lib.call(ks.glu.symbol, acc)
    h = tn // 2
    g, u = (x.T.astype(np.float32) for x in split_glu(want.T))   # the (gate, up) column-block pairs
    with np.errstate(over="ignore"):
        glu = to_bf16(g / (np.float32(1.0) + np.exp(-g)) * u)
    got.append(unblock(acc[:tm * h], tm, h))
    wants.append(glu)
    # swiglu.cc's bound on bf16 inputs, plus the gate / up inputs' own block-float error (one bf16 ulp each)
    bounds.append(_close(glu, 2.0**-6, 2.0**-9) + 2 * _close(glu, 2.0**-8, 2.0**-10))
    acc, _ = _gemm_acc(lib, ks, a, w, tk, steps)
    b = rand(rng, (tn,))
    lib.call(ks.bias.symbol, acc, A(b))
    qa, qw = to_bfp16ebs8(a.astype(np.float32)), to_bfp16ebs8(w.astype(np.float32))
    biased = to_bf16(qa.astype(np.float64) @ qw.astype(np.float64).T + b.astype(np.float64)[None, :])
    got.append(unblock(acc[:tm * tn], tm, tn))
    wants.append(biased)
    bounds.append(_close(biased, 2.0**-8, 2.0**-12))
    flat = lambda xs: np.concatenate([x.reshape(-1) for x in xs])   # noqa: E731
    return Run(flat(got), flat(wants), flat(bounds), counts)


def _gemm_bfp(lib, rng, tm, tk, tn):
    return _gemm(lib, rng, tm, tk, tn, w_format="bfp16")


# -------------------------------------------------------------------------------------------- attention
def prefill_case(rng, hd, lq, lk, qcycle=1, pos=None, heads=2):
    """The data of one prefill launch iteration as the builder streams it: a Q super tile of qcycle * lq rows for
    `heads` query heads at `pos` (this core: the last of the qcycle interleaved ones, the last head), a KV window
    one tile longer than the causal bound (that tile holds inf/NaN: never read)."""
    pos = 3 * lk + 5 if pos is None else pos
    span = qcycle * lq
    kv_rows = -(-(pos + span) // lk) * lk + lk
    q = rand(rng, (span, heads * hd), 1.5)
    k, v = rand(rng, (kv_rows, hd), 1.5), rand(rng, (kv_rows, hd))
    k[pos + span:], v[pos + span:] = np.inf, np.nan
    x, y = qcycle - 1, heads - 1
    rows = np.array([(x + i * qcycle) * 8 + r for i in range(lq // 8) for r in range(8)])   # this core's rows
    return pos, kv_rows, q, k, v, x, y, rows


def _prefill(lib, rng, hd, lq, lk, n=None, window=None, scale_dim=None, pos=None, bfp_want=True):
    """One core of a herd of `n` (qcycle) interleaved query-block cores x 2 heads: the Q stream (every core's 8-row
    blocks, head-major, 8x8-blocked items of 2*lk rows), then the K/V items; against the exact reference (or, with
    bfp_want, the block-float model of the kernel's arithmetic, reference.attention_block_float)."""
    qcycle = n or 1
    ks = attention_prefill_kernels(hd, lq, lk, window, scale_dim, qcycle)
    pos, kv_rows, q, k, v, x, y, rows = prefill_case(rng, hd, lq, lk, qcycle, pos)
    heads = q.shape[1] // hd
    per_head = -(-len(q) // (2 * lk))                # items per head (the builder's plan: X*lq/(2lk), or 1)
    pad = np.zeros((per_head * 2 * lk - len(q), hd), BF16)
    stream = np.concatenate([np.concatenate([q[:, h * hd:(h + 1) * hd], pad]) for h in range(heads)])  # head-major
    items = [block(stream[i:i + 2 * lk]) for i in range(0, len(stream), 2 * lk)]
    slot = y * (per_head * 2 * lk // 8) + x
    state, qbuf = A(np.empty(lq * (hd + 2), np.float32)), A(np.empty((lq, hd), BF16))
    lib.call(ks.init.symbol, state, qbuf)
    n_q, q_pos0 = len(items), pos + 8 * x
    for t, it in enumerate(items):
        lib.call(ks.update.symbol, A(it), qbuf, state, t, n_q, slot, q_pos0)
    counts = None
    for t in range(kv_rows // lk):
        it = A(block(np.concatenate([k[t * lk:(t + 1) * lk], v[t * lk:(t + 1) * lk]])))
        c = lib.call(ks.update.symbol, it, qbuf, state, n_q + t, n_q, slot, q_pos0)
        if (t + 1) * lk <= pos + 1:
            counts = c                        # the last tile every query row sees whole
    out = A(np.full((lq, hd), np.nan, BF16))     # NaN: an element finish does not write shows
    lib.call(ks.out.symbol, state, out)
    kw = dict(rows=len(q), kv_rows=kv_rows, heads=heads, kv_heads=1, head_dim=hd, window=window, scale_dim=scale_dim)
    if bfp_want:
        want = ref.attention_block_float(q, k, v, pos, lk=lk, **kw)[rows, y * hd:(y + 1) * hd]
        return Run(out, want, _close(want, 2.0**-6, 2.0**-7), counts)
    want = ref.attention(q, k, v, pos, **kw)[rows, y * hd:(y + 1) * hd]
    return Run(out, want, _close(want, 2.0**-3, 2.0**-5), counts)


def _decode(lib, rng, hd, g, lk, parts, pos=None, window=None, scale_dim=None):
    ks = attention_decode_kernels(hd, g, lk, parts, window, scale_dim)
    kv_rows = 2 * lk * parts
    pos = kv_rows - lk // 2 - 1 if pos is None else pos
    k, v, q = rand(rng, (kv_rows, hd), 1.5), rand(rng, (kv_rows, hd)), rand(rng, (g, hd), 1.5)
    k[pos + 1:], v[pos + 1:] = np.nan, np.inf
    share = kv_rows // parts
    states = []                     # each core's state is its own L1 buffer; the merge gets them concatenated
    counts = None
    for s in range(parts):
        st = A(np.empty(g * (hd + 2), np.float32))
        lib.call(ks.init.symbol, st)
        for t in range(share // lk):
            r0 = s * share + t * lk
            item = A(np.concatenate([k[r0:r0 + lk], v[r0:r0 + lk], q]))
            c = lib.call(ks.update.symbol, item, st, pos, r0)
            counts = counts or c
        states.append(st)
    out = A(np.empty((g, hd), BF16))
    lib.call(ks.out.symbol, A(np.concatenate(states)), out)
    want = ref.attention(q.reshape(1, -1), k, v, pos, rows=1, kv_rows=kv_rows, heads=g, kv_heads=1,
                         head_dim=hd, window=window, scale_dim=scale_dim).reshape(g, hd)
    return Run(out, want, _close(want, 2.0**-6, 2.0**-8), counts)


def _attention(lib, rng, mode, hd, lq, lk, n, window=None, scale_dim=None):
    if mode == "p":
        return _prefill(lib, rng, hd, lq, lk, n, window=window, scale_dim=scale_dim)
    return _decode(lib, rng, hd, lq, lk, n, window=window, scale_dim=scale_dim)


def driver(family_name: str):
    """The driver of a family: the function named `_<family>` here (no second list of the kernels to keep)."""
    from kernel_builder import aie_host_runs_bfp, aie_host_runs_kv8
    fn = globals().get(f"_{family_name}") or getattr(aie_host_runs_kv8, f"_{family_name}", None) \
        or getattr(aie_host_runs_bfp, f"_{family_name}", None)
    if fn is None:
        raise ValueError(f"no host aie_api driver for kernel family {family_name!r}")
    return fn


def counts(obj: str, seed: int = 0) -> dict[str, int]:
    """Instruction counts of one representative call of the object's compute entry point (see the module doc;
    kinds: docs/aie-api-host.md). Data-independent for every kernel but attention, whose masked/visible split
    follows the positions the driver uses (fully visible here)."""
    return run(obj, np.random.default_rng(seed)).counts


def run(obj: str, rng, lib: aie_host.AieHostLibrary | None = None) -> Run:
    """Run the object's kernel (its vector path; `lib` overrides the library, e.g. a mutated source's)."""
    name, params = family(obj)
    return driver(name)(lib or aie_host.load(kernel_of(obj)), rng, *params)


def main(argv=None) -> int:
    """`python -m kernel_builder.aie_host_runs OBJ.o ...`: the counts of one representative call of each object, and
    whether its vector path matches the reference (one line per object)."""
    import argparse

    ap = argparse.ArgumentParser(description=main.__doc__)
    ap.add_argument("objects", nargs="+", help="kernel object names, e.g. gemm_m64_k64_n64.o")
    args = ap.parse_args(argv)
    bad = 0
    for obj in args.objects:
        r = run(obj, np.random.default_rng(0))
        why = mismatch(r)
        bad += bool(why)
        shown = ", ".join(f"{k}={v}" for k, v in r.counts.items() if v)
        print(f"{obj}: {'MISMATCH ' + why if why else 'matches the reference'}; {shown}")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
