"""An interpreter for the AIR module text our builders and the stitcher emit.

The `emu` device computes each launch with the kernel's numpy reference: wiring comes from the text, but a
herd body is never looked at, so a wrong DMA offset/size/stride, a herd that covers the wrong rows or a wrong
loop bound goes unnoticed. This interpreter executes the text itself:

- `func.func` body, `air.launch` (its grid iterated), `air.segment`, `air.herd` (tiles run one after the other:
  they are independent), `scf.for` (with `iter_args` / `scf.yield`);
- `arith` / `math` scalars, `memref.alloc/dealloc/load/store`, `linalg.fill`, `linalg.matmul` (f32
  accumulate), `linalg.generic` (identity maps, all-parallel: evaluated on whole arrays);
- `air.dma_memcpy_nd` with offsets/sizes/strides on both sides (AIR semantics: lists outermost first, in
  elements; element i of dimension d is at (offset_d + i) * stride_d; `[] [] []` = whole buffer, contiguous);
  every index is bounds checked, so a tiling bug that reads past a buffer fails loudly;
- `air.channel` declarations (module level, optional `broadcast_shape`) and synchronous
  `air.channel.put` / `air.channel.get` (see "Channels" below);
- `func.call` of the external C++ kernels (kernel_builder/external_kernels/*.cc): each symbol family is
  re-implemented in numpy following the host scalar path (f32 math in the same order, RNE bf16 stores).

Channels. An AIR channel is a FIFO per channel index carrying a stream of elements: the gets on index i
receive, in order, the elements of the puts that reach i (one put may feed several gets, e.g. a put of four
tiles and four gets of one tile; a get may span puts of the same element type). A put on a channel with `broadcast_shape` reaches every index that equals its own on the
non-broadcast dimensions (a size-1 dimension fans out to the broadcast extent), e.g. `@a [8, 1]
{broadcast_shape = [8, 4]}`: a put on [i, 0] feeds the gets on [i, 0..3]. On the device producer and
consumers run concurrently; here ops run one after the other in program order (segment ops, then the herd
tiles one by one), so the interpreter needs an order in which every get finds its data: a put *copies* the
bytes it sends (snapshot at put time, as the DMA reads them then) into unbounded per-index FIFOs, and a get
pops from its own FIFO. This is faithful when each producer precedes its consumers in program order (our
GEMM: the segment's K loop puts every panel slice, then the herd's tiles each get their slices in K order):
the values received do not depend on timing, only on the put order per index, which is the same; the
device's bounded FIFO depth only makes the producer wait. A get on an empty FIFO (more gets than puts, or
a consumer placed before its producer) and puts left unconsumed when an air.segment / the function ends
(the device would hang) raise InterpError.

`compile_module(text)` parses once into closures; `Program.run(args)` executes on memrefs that wrap the
caller's arrays in place. Anything outside this subset raises `InterpError` naming the op and its line.
"""
from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from kernel_builder import air_ops
from kernel_builder import mlir_text as mt
from kernel_builder.dtypes import DTYPES as _DTYPE_TABLE
from kernel_builder.air_ops import MemRefType, OpText
from kernel_builder.numerics import BF16
from kernel_builder.external_models import ModelError
from kernel_builder.externals import external_model

F32 = np.float32
# memref element type -> numpy dtype, from the one dtype table (packed sub-byte types are not interpreted)
DTYPES = {d.mlir: d.host for d in _DTYPE_TABLE.values() if d.packed == 1}
L1_SPACE = 2


class InterpError(ValueError):
    pass


# ------------------------------------------------------------------------------------------------ values

class MemRef:
    """A memref value: a flat array of its element type (in place over the caller's bytes for arguments)."""

    __slots__ = ("data", "shape", "dtype", "space", "strides", "written", "name")

    def __init__(self, data: np.ndarray, shape: tuple[int, ...], dtype: str, space: int = 0, name: str = ""):
        self.data, self.shape, self.dtype, self.space, self.name = data, shape, dtype, space, name
        st, acc = [], 1
        for d in reversed(shape):
            st.append(acc)
            acc *= d
        self.strides = tuple(reversed(st))
        self.written = False

    @property
    def nbytes(self) -> int:
        return self.data.nbytes


def parse_memref_type(text: str) -> MemRefType:
    t = air_ops.parse_memref_type(text)
    if t.dtype not in DTYPES:
        raise ValueError(f"unsupported element type {t.dtype!r} in {text!r}")
    return t


# ------------------------------------------------------------------------------------------------ parsing
# Op splitting is shared with the hardware model (kernel_builder.air_ops).

_SSA = air_ops.SSA
_top_groups = air_ops.top_groups
_Ctx = air_ops.ModuleCtx
_split_block = air_ops.split_block


def _region_span(op: OpText) -> tuple[int, int]:
    """Span (inside the braces, relative to op.full) of the op's trailing region."""
    span = air_ops.region_span(op)
    if span is None:
        raise InterpError(f"{op.where()}: expected a region")
    return span


# ------------------------------------------------------------------------------------------------ execution

Env = dict
Fn = Callable[[Env], None]


def _operand(tok: str) -> Callable[[Env], object]:
    tok = tok.strip()
    if tok.startswith("%"):
        def get(env, _n=tok):
            try:
                return env[_n]
            except KeyError:
                raise InterpError(f"value {_n} is not defined in this region") from None
        return get
    if re.fullmatch(r"-?\d+", tok):
        v = int(tok)
        return lambda env: v
    raise InterpError(f"unsupported operand {tok!r}")


def _operands(text: str) -> list[Callable[[Env], object]]:
    text = text.strip()
    return [] if not text else [_operand(t) for t in text.split(",")]


def _cast(value, ty: str):
    """A scalar or array result of type `ty`: floats rounded (RNE) to the type, ints wrapped to their width."""
    if ty == "index":
        return int(value)
    if ty == "f32":
        return np.asarray(value, dtype=F32)[()]
    if ty == "bf16":  # RNE via f32 (ml_dtypes' cast)
        return np.asarray(value, dtype=F32).astype(BF16)[()]
    if ty == "f64":
        return np.asarray(value, dtype=np.float64)[()]
    m = re.fullmatch(r"i(\d+)", ty)
    if m:
        bits = int(m.group(1))
        if bits == 1:
            return bool(value) if np.ndim(value) == 0 else np.asarray(value, dtype=bool)
        if np.ndim(value) == 0:
            v = int(value) & ((1 << bits) - 1)
            return v - (1 << bits) if v >> (bits - 1) else v
        return np.asarray(value).astype(np.int64).astype(f"int{bits}")
    raise InterpError(f"unsupported type {ty!r}")


def _f(x):
    """An f32 view of a float operand (bf16 -> f32 is exact)."""
    return np.asarray(x, dtype=F32)[()] if np.ndim(x) == 0 else np.asarray(x).astype(F32, copy=False)


def _fdiv(a, b):
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.divide(a, b)


_FLOAT_BINARY = {
    "arith.addf": np.add, "arith.subf": np.subtract, "arith.mulf": np.multiply, "arith.divf": _fdiv,
    "arith.maximumf": np.maximum, "arith.maxf": np.maximum, "arith.maxnumf": np.fmax,
    "arith.minimumf": np.minimum, "arith.minf": np.minimum, "arith.minnumf": np.fmin,
}


def _idiv_trunc(a, b):
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b >= 0) else -q


_INT_BINARY = {
    "arith.addi": lambda a, b: a + b, "arith.subi": lambda a, b: a - b, "arith.muli": lambda a, b: a * b,
    "arith.divui": lambda a, b: a // b, "arith.remui": lambda a, b: a % b,
    "arith.divsi": _idiv_trunc, "arith.remsi": lambda a, b: a - _idiv_trunc(a, b) * b,
    "arith.floordivsi": lambda a, b: a // b, "arith.ceildivsi": lambda a, b: -((-a) // b),
    "arith.ceildivui": lambda a, b: -((-a) // b),
    "arith.maxsi": max, "arith.minsi": min, "arith.maxui": max, "arith.minui": min,
    "arith.andi": lambda a, b: a & b, "arith.ori": lambda a, b: a | b, "arith.xori": lambda a, b: a ^ b,
    "arith.shli": lambda a, b: a << b,
}

_CMPI = {"eq": lambda a, b: a == b, "ne": lambda a, b: a != b, "slt": lambda a, b: a < b,
         "sle": lambda a, b: a <= b, "sgt": lambda a, b: a > b, "sge": lambda a, b: a >= b,
         "ult": lambda a, b: a < b, "ule": lambda a, b: a <= b, "ugt": lambda a, b: a > b,
         "uge": lambda a, b: a >= b}
_CMPF = {"oeq": np.equal, "one": np.not_equal, "olt": np.less, "ole": np.less_equal, "ogt": np.greater,
         "oge": np.greater_equal, "ueq": np.equal, "une": np.not_equal, "ult": np.less, "ule": np.less_equal,
         "ugt": np.greater, "uge": np.greater_equal}


def _rsqrt(x):
    with np.errstate(divide="ignore", invalid="ignore"):
        return F32(1.0) / np.sqrt(x)


def _exp(x):
    with np.errstate(over="ignore"):
        return np.exp(x)


_MATH_UNARY = {"math.rsqrt": _rsqrt, "math.sqrt": np.sqrt, "math.exp": _exp, "math.tanh": np.tanh,
               "math.log": np.log, "math.absf": np.abs, "arith.negf": np.negative, "math.erf": None}


@dataclass
class Stats:
    """What one run did: DMA count/bytes, external calls, herd tiles, peak L1 bytes of one tile."""
    dmas: int = 0
    dma_bytes: int = 0
    calls: int = 0
    tiles: int = 0
    peak_l1_bytes: int = 0
    channel_puts: int = 0
    channel_gets: int = 0
    channel_put_bytes: int = 0   # bytes read by puts (a broadcast put counts once)
    calls_by_symbol: dict = field(default_factory=dict)


class _State:
    def __init__(self):
        self.stats = Stats()
        self.l1_live = 0
        self.fifos: dict[tuple, deque] = {}  # (channel, index tuple) -> deque of (data, dtype, source name)

    def pending_puts(self) -> list[str]:
        return [f"{sum(d.size for d, _, _ in q)} element(s) of {len(q)} put(s) on @{sym}{list(idx)}"
                for (sym, idx), q in self.fifos.items() if q]

    def on_alloc(self, m: MemRef):
        if m.space == L1_SPACE:
            self.l1_live += m.nbytes
            self.stats.peak_l1_bytes = max(self.stats.peak_l1_bytes, self.l1_live)

    def on_dealloc(self, m: MemRef):
        if m.space == L1_SPACE:
            self.l1_live -= m.nbytes


class _Compiler:
    def __init__(self, ctx: _Ctx, channels: dict | None = None):
        self.ctx = ctx
        self.state: _State | None = None  # bound at run time
        self.channels: dict[str, tuple[tuple[int, ...], tuple[int, ...]]] = channels or {}  # sym -> (size, bcast)

    # -- blocks ---------------------------------------------------------------------------------------------
    def block(self, start: int, end: int, terminators=()) -> tuple[list[Fn], OpText | None]:
        fns, term = [], None
        for op in _split_block(self.ctx, start, end):
            if op.name in terminators:
                term = op
                continue
            fns.append(self._wrap(op, self.op(op)))
        return fns, term

    @staticmethod
    def _wrap(op: OpText, fn: Fn) -> Fn:
        def run(env, _fn=fn, _op=op):
            try:
                _fn(env)
            except InterpError:
                raise
            except Exception as e:  # name the op that failed
                raise InterpError(f"{_op.where()}: {type(e).__name__}: {e}") from e
        return run

    def op(self, op: OpText) -> Fn:
        name = op.name
        try:
            if name == "arith.constant":
                return self._constant(op)
            if name in _FLOAT_BINARY or name in _INT_BINARY:
                return self._binary(op)
            if name in ("arith.extf", "arith.truncf", "arith.index_cast", "arith.index_castui", "arith.sitofp",
                        "arith.uitofp", "arith.fptosi", "arith.fptoui", "arith.extsi", "arith.extui",
                        "arith.trunci"):
                return self._cast_op(op)
            if name in _MATH_UNARY and _MATH_UNARY[name] is not None:
                return self._unary(op)
            if name in ("arith.cmpi", "arith.cmpf"):
                return self._cmp(op)
            if name == "arith.select":
                return self._select(op)
            if name == "memref.alloc":
                return self._alloc(op)
            if name == "memref.dealloc":
                return self._dealloc(op)
            if name == "memref.load":
                return self._load(op)
            if name == "memref.store":
                return self._store(op)
            if name == "air.dma_memcpy_nd":
                return self._dma(op)
            if name in ("air.channel.put", "air.channel.get"):
                return self._channel(op)
            if name == "func.call":
                return self._call(op)
            if name == "linalg.fill":
                return self._fill(op)
            if name == "linalg.matmul":
                return self._matmul(op)
            if name == "linalg.generic":
                return self._generic(op)
            if name == "scf.for":
                return self._for(op)
            if name in ("air.launch", "air.segment", "air.herd"):
                return self._air_region(op)
        except InterpError:
            raise
        except Exception as e:
            raise InterpError(f"{op.where()}: cannot parse {name}: {e}") from e
        raise InterpError(f"{op.where()}: unsupported op {name!r} (the interpreter covers the subset our "
                          "builders emit; see docs/emulation.md)")

    # -- arith / math -----------------------------------------------------------------------------------------
    def _constant(self, op):
        m = re.fullmatch(r"arith\.constant\s+(\S+)\s*:\s*(\w+)", op.text.strip())
        if m is None:
            raise InterpError(f"{op.where()}: unsupported constant form")
        lit, ty = m.groups()
        if lit in ("true", "false"):
            value = lit == "true"
        elif ty in ("f32", "bf16", "f64"):
            value = _hex_float(lit, ty) if lit.startswith("0x") else _cast(float(lit), ty)
        else:
            value = _cast(int(lit, 0), ty)
        res = op.results[0]

        def run(env):
            env[res] = value
        return run

    def _binary(self, op):
        m = re.fullmatch(rf"{re.escape(op.name)}\s+({_SSA})\s*,\s*({_SSA})\s*(?:\{{[^}}]*\}}\s*)?:\s*(\w+)",
                         op.text.strip())
        if m is None:
            raise InterpError(f"{op.where()}: unsupported {op.name} form")
        a, b, ty = _operand(m.group(1)), _operand(m.group(2)), m.group(3)
        res = op.results[0]
        if op.name in _FLOAT_BINARY:
            fn = _FLOAT_BINARY[op.name]
            if ty == "f32":
                def run(env):
                    env[res] = fn(_f(a(env)), _f(b(env)))
            else:
                def run(env):
                    env[res] = _cast(fn(_f(a(env)), _f(b(env))), ty)
            return run
        fn = _INT_BINARY[op.name]
        if ty == "index":
            def run(env):
                env[res] = fn(a(env), b(env))
        else:
            def run(env):
                env[res] = _cast(fn(int(a(env)), int(b(env))), ty)
        return run

    def _cast_op(self, op):
        m = re.fullmatch(rf"{re.escape(op.name)}\s+({_SSA})\s*:\s*(\w+)\s+to\s+(\w+)", op.text.strip())
        if m is None:
            raise InterpError(f"{op.where()}: unsupported {op.name} form")
        a, dst = _operand(m.group(1)), m.group(3)
        res = op.results[0]
        if op.name == "arith.extf":
            def run(env):
                env[res] = _f(a(env)) if dst == "f32" else _cast(_f(a(env)), dst)
        elif op.name == "arith.truncf":  # RNE, as the NPU's conv_even
            def run(env):
                env[res] = _cast(a(env), dst)
        elif op.name in ("arith.fptosi", "arith.fptoui"):
            def run(env):
                env[res] = _cast(np.trunc(a(env)), dst)
        else:
            def run(env):
                v = a(env)
                env[res] = _cast(v, dst) if dst not in ("f32", "bf16") else _cast(float(v), dst)
        return run

    def _unary(self, op):
        m = re.fullmatch(rf"{re.escape(op.name)}\s+({_SSA})\s*(?:\{{[^}}]*\}}\s*)?:\s*(\w+)", op.text.strip())
        if m is None:
            raise InterpError(f"{op.where()}: unsupported {op.name} form")
        a, ty = _operand(m.group(1)), m.group(2)
        fn, res = _MATH_UNARY[op.name], op.results[0]

        def run(env):
            env[res] = _cast(fn(_f(a(env))), ty)
        return run

    def _cmp(self, op):
        m = re.fullmatch(rf"{re.escape(op.name)}\s+(\w+)\s*,\s*({_SSA})\s*,\s*({_SSA})\s*:\s*(\w+)", op.text.strip())
        if m is None:
            raise InterpError(f"{op.where()}: unsupported {op.name} form")
        pred, a, b = m.group(1), _operand(m.group(2)), _operand(m.group(3))
        table = _CMPI if op.name == "arith.cmpi" else _CMPF
        if pred not in table:
            raise InterpError(f"{op.where()}: unsupported predicate {pred!r}")
        fn, res = table[pred], op.results[0]

        def run(env):
            env[res] = fn(a(env), b(env))
        return run

    def _select(self, op):
        m = re.fullmatch(rf"arith\.select\s+({_SSA})\s*,\s*({_SSA})\s*,\s*({_SSA})\s*:\s*(\w+)", op.text.strip())
        if m is None:
            raise InterpError(f"{op.where()}: unsupported arith.select form")
        c, a, b = (_operand(m.group(i)) for i in (1, 2, 3))
        res = op.results[0]

        def run(env):
            cond = c(env)
            env[res] = (a(env) if cond else b(env)) if np.ndim(cond) == 0 else np.where(cond, a(env), b(env))
        return run

    # -- memref ---------------------------------------------------------------------------------------------
    def _alloc(self, op):
        m = re.fullmatch(r"memref\.alloc\(\)\s*:\s*(memref<.*>)", op.text.strip(), re.DOTALL)
        if m is None:
            raise InterpError(f"{op.where()}: only `memref.alloc() : memref<static shape>` is supported")
        t = parse_memref_type(m.group(1))
        res, dt = op.results[0], DTYPES[t.dtype]

        def run(env):
            # Uninitialised memory on the device: NaN-filled floats make a read-before-write visible.
            data = np.full(t.size, np.nan, dtype=dt) if dt.kind == "f" or t.dtype == "bf16" \
                else np.zeros(t.size, dtype=dt)
            mr = MemRef(data, t.shape, t.dtype, t.space, res)
            env[res] = mr
            self.state.on_alloc(mr)
        return run

    def _dealloc(self, op):
        m = re.fullmatch(rf"memref\.dealloc\s+({_SSA})\s*:\s*.*", op.text.strip(), re.DOTALL)
        a = _operand(m.group(1))

        def run(env):
            self.state.on_dealloc(a(env))
        return run

    @staticmethod
    def _flat_index(mr: MemRef, idx: list[int]) -> int:
        if len(idx) != len(mr.shape):
            raise InterpError(f"{len(idx)} indices for a rank-{len(mr.shape)} memref")
        flat = 0
        for i, d, s in zip(idx, mr.shape, mr.strides):
            if not 0 <= i < d:
                raise InterpError(f"index {idx} out of bounds for memref shape {mr.shape}")
            flat += i * s
        return flat

    def _load(self, op):
        m = re.fullmatch(rf"memref\.load\s+({_SSA})\[(.*?)\]\s*(?:\{{(.*?)\}}\s*)?:\s*(memref<.*>)", op.text.strip(),
                         re.DOTALL)
        if m is None:
            raise InterpError(f"{op.where()}: unsupported memref.load form")
        buf, idx, res = _operand(m.group(1)), _operands(m.group(2)), op.results[0]
        flat = self._flat_index
        # `llama_npu.range = [lo, hi]`: the values the builder promises (the hardware model costs the work at
        # them); a value outside is a builder or caller error
        rng = re.search(r"llama_npu\.range\s*=\s*\[\s*(-?\d+)\s*,\s*(-?\d+)\s*\]", m.group(3) or "")
        lo, hi = (int(rng.group(1)), int(rng.group(2))) if rng else (None, None)
        where = op.where()

        def run(env):
            mr = buf(env)
            val = mr.data[flat(mr, [f(env) for f in idx])]
            if lo is not None and not lo <= int(val) <= hi:
                raise InterpError(f"{where}: loaded {int(val)} outside its declared llama_npu.range [{lo}, {hi}]")
            env[res] = val
        return run

    def _store(self, op):
        m = re.fullmatch(rf"memref\.store\s+({_SSA})\s*,\s*({_SSA})\[(.*?)\]\s*:\s*(memref<.*>)", op.text.strip(),
                         re.DOTALL)
        if m is None:
            raise InterpError(f"{op.where()}: unsupported memref.store form")
        val, buf, idx = _operand(m.group(1)), _operand(m.group(2)), _operands(m.group(3))
        flat = self._flat_index

        def run(env):
            mr = buf(env)
            mr.data[flat(mr, [f(env) for f in idx])] = val(env)
            mr.written = True
        return run

    # -- air.dma_memcpy_nd ------------------------------------------------------------------------------------
    def _dma(self, op):
        body = op.text.strip()[len("air.dma_memcpy_nd"):].strip()
        if body.startswith("async") or body.startswith("["):
            raise InterpError(f"{op.where()}: async air.dma_memcpy_nd is not supported")
        groups = _top_groups(body)
        if not groups or groups[0][0] != "(":
            raise InterpError(f"{op.where()}: expected `(dst..., src...)`")
        inner = body[groups[0][1] + 1:groups[0][2] - 1]
        sides = mt.split_top_level(inner)
        if len(sides) != 2:
            raise InterpError(f"{op.where()}: expected two access patterns, found {len(sides)}")
        dst, src = (self._access(op, s) for s in sides)
        state_ref = self

        def run(env):
            d, di = dst(env)
            s, si = src(env)
            if di.size != si.size:
                raise InterpError(f"{op.where()}: DMA moves {si.size} elements from {s.name} but writes "
                                  f"{di.size} into {d.name}")
            if d.dtype != s.dtype:
                raise InterpError(f"{op.where()}: DMA between {s.dtype} and {d.dtype}")
            d.data[di] = s.data[si]
            d.written = True
            st = state_ref.state.stats
            st.dmas += 1
            st.dma_bytes += di.size * d.data.itemsize
        return run

    def _access(self, op, text: str):
        m = re.fullmatch(rf"({_SSA})\s*\[(.*?)\]\s*\[(.*?)\]\s*\[(.*?)\]", text.strip(), re.DOTALL)
        if m is None:
            raise InterpError(f"{op.where()}: cannot read access pattern {text!r}")
        buf = _operand(m.group(1))
        offs, sizes, strides = (_operands(m.group(i)) for i in (2, 3, 4))
        if not (len(offs) == len(sizes) == len(strides)):
            raise InterpError(f"{op.where()}: offsets/sizes/strides of {m.group(1)} differ in length")
        cache: dict = {}

        def resolve(env):
            mr: MemRef = buf(env)
            if not isinstance(mr, MemRef):
                raise InterpError(f"{op.where()}: {m.group(1)} is not a memref")
            n = mr.data.size
            if not offs:
                key = ("all", n)
            else:
                key = tuple(f(env) for f in offs) + tuple(f(env) for f in sizes) + tuple(f(env) for f in strides) \
                    + (n,)
            idx = cache.get(key)
            if idx is None:
                if not offs:
                    idx = np.arange(n)
                else:
                    k = len(offs)
                    o, s, t = key[:k], key[k:2 * k], key[2 * k:3 * k]
                    if any(v <= 0 for v in s):
                        raise InterpError(f"{op.where()}: non-positive DMA size {list(s)} on {m.group(1)}")
                    idx = np.zeros((), dtype=np.int64)
                    for off, size, stride in zip(o, s, t):
                        idx = idx[..., None] + (off + np.arange(size, dtype=np.int64)) * stride
                    idx = idx.reshape(-1)
                    lo, hi = int(idx.min()), int(idx.max())
                    if lo < 0 or hi >= n:
                        raise InterpError(
                            f"{op.where()}: access {m.group(1)} offsets {list(o)} sizes {list(s)} strides "
                            f"{list(t)} touches element {lo if lo < 0 else hi} of a {n}-element buffer "
                            f"(shape {mr.shape})")
                if len(cache) < 4096:
                    cache[key] = idx
            return mr, idx
        return resolve

    # -- calls ------------------------------------------------------------------------------------------------
    def _call(self, op):
        m = re.fullmatch(r"func\.call\s+@([\w$.]+)\((.*?)\)\s*:\s*\((.*)\)\s*->\s*\(\s*\)", op.text.strip(),
                         re.DOTALL)
        if m is None:
            raise InterpError(f"{op.where()}: only `func.call @f(...) : (...) -> ()` is supported")
        sym, args = m.group(1), _operands(m.group(2))
        impl = external_model(sym)
        if impl is None:
            raise InterpError(f"{op.where()}: no interpreter implementation of external kernel @{sym}")
        state_ref = self

        def run(env):
            values = [a(env) for a in args]
            try:
                impl(*values)
            except (InterpError, ModelError) as e:
                raise InterpError(f"{op.where()}: @{sym}: {e}") from None
            st = state_ref.state.stats
            st.calls += 1
            st.calls_by_symbol[sym] = st.calls_by_symbol.get(sym, 0) + 1
        return run

    # -- air.channel.put / get ----------------------------------------------------------------------------
    def _channel(self, op):
        m = re.fullmatch(r"air\.channel\.(put|get)\s+@([\w$.\-]+)\s*\[(.*?)\]\s*\((.*)\)\s*:\s*\((.*)\)",
                         op.text.strip(), re.DOTALL)
        if m is None:
            raise InterpError(f"{op.where()}: unsupported {op.name} form (only the synchronous "
                              "`@chan[indices] (buf[offsets] [sizes] [strides]) : (type)` is)")
        kind, sym = m.group(1), m.group(2)
        if sym not in self.channels:
            raise InterpError(f"{op.where()}: air.channel.{kind} on undeclared channel @{sym}")
        size, bcast = self.channels[sym]
        indices = _operands(m.group(3))
        if indices and len(indices) != len(size):
            raise InterpError(f"{op.where()}: {len(indices)} indices for channel @{sym} of rank {len(size)}")
        access = self._access(op, m.group(4))
        state_ref = self

        def index_of(env) -> tuple[int, ...]:
            idx = tuple(int(f(env)) for f in indices) if indices else (0,) * len(size)
            return idx

        def put(env):
            idx = index_of(env)
            if any(not 0 <= v < d for v, d in zip(idx, size)):
                raise InterpError(f"{op.where()}: put on @{sym}{list(idx)} outside its bundle {list(size)}")
            s, si = access(env)
            item = (s.data[si].copy(), s.dtype, s.name)  # a put sends the bytes as they are now
            # destinations: size-1 dimensions fan out to the broadcast extent, the others keep the put index
            dims = [range(b) if d == 1 and b > 1 else (v,) for v, d, b in zip(idx, size, bcast)]
            fifos = state_ref.state.fifos
            for dest in np.ndindex(*[len(r) for r in dims]):
                key = (sym, tuple(r[i] for r, i in zip(dims, dest)))
                fifos.setdefault(key, deque()).append(item)
            st = state_ref.state.stats
            st.channel_puts += 1
            st.channel_put_bytes += item[0].nbytes

        def get(env):
            idx = index_of(env)
            if any(not 0 <= v < b for v, b in zip(idx, bcast)):
                raise InterpError(f"{op.where()}: get on @{sym}{list(idx)} outside its broadcast shape "
                                  f"{list(bcast)}")
            q = state_ref.state.fifos.get((sym, idx))
            if not q:
                raise InterpError(f"{op.where()}: get on @{sym}{list(idx)} finds no data: no put reached this "
                                  "index before it in program order (the device would wait forever)")
            d, di = access(env)
            # a channel is a stream: a get takes the next di.size elements, from one put or several, leaving
            # the rest of a larger put for the following gets (a put of n tiles feeds n gets of one tile)
            parts, need = [], di.size
            while need:
                if not q:
                    got = di.size - need
                    raise InterpError(f"{op.where()}: get of {di.size} elements into {d.name} on @{sym}{list(idx)} "
                                      f"finds only {got}: the puts before it in program order send too little "
                                      "(the device would wait forever)")
                data, dtype, src = q[0]
                if d.dtype != dtype:
                    raise InterpError(f"{op.where()}: channel @{sym} carries {dtype} from {src}, {d.name} is "
                                      f"{d.dtype}")
                if data.size <= need:
                    q.popleft()
                    parts.append(data)
                    need -= data.size
                else:
                    parts.append(data[:need])
                    q[0] = (data[need:], dtype, src)
                    need = 0
            d.data[di] = parts[0] if len(parts) == 1 else np.concatenate(parts)
            d.written = True
            state_ref.state.stats.channel_gets += 1
        return put if kind == "put" else get

    # -- linalg -----------------------------------------------------------------------------------------------
    def _fill(self, op):
        m = re.fullmatch(rf"linalg\.fill\s+ins\(({_SSA})\s*:\s*\w+\)\s*outs\(({_SSA})\s*:\s*memref<.*>\)",
                         op.text.strip(), re.DOTALL)
        if m is None:
            raise InterpError(f"{op.where()}: unsupported linalg.fill form")
        v, out = _operand(m.group(1)), _operand(m.group(2))

        def run(env):
            mr = out(env)
            mr.data[:] = v(env)
            mr.written = True
        return run

    def _matmul(self, op):
        m = re.fullmatch(rf"linalg\.matmul\s+ins\(({_SSA})\s*,\s*({_SSA})\s*:.*?\)\s*outs\(({_SSA})\s*:.*\)",
                         op.text.strip(), re.DOTALL)
        if m is None:
            raise InterpError(f"{op.where()}: unsupported linalg.matmul form")
        a, b, c = (_operand(m.group(i)) for i in (1, 2, 3))

        def run(env):
            ma, mb, mc = a(env), b(env), c(env)
            (mm, kk), (k2, nn), (m2, n2) = ma.shape, mb.shape, mc.shape
            if kk != k2 or mm != m2 or nn != n2:
                raise InterpError(f"linalg.matmul shapes {ma.shape} x {mb.shape} -> {mc.shape}")
            if mc.dtype != "f32":
                raise InterpError("linalg.matmul: only an f32 accumulator is supported")
            acc = mc.data.reshape(mm, nn)
            acc += ma.data.reshape(mm, kk).astype(F32) @ mb.data.reshape(kk, nn).astype(F32)
            mc.written = True
        return run

    def _generic(self, op):
        head_end = _region_span(op)[0] - 1
        head = op.full[:head_end]
        maps = re.findall(r"affine_map<\(([^)]*)\)\s*->\s*\(([^)]*)\)>", head)
        if not maps or any(d.replace(" ", "") != r.replace(" ", "") for d, r in maps):
            raise InterpError(f"{op.where()}: linalg.generic: only identity indexing maps are supported")
        iters = re.search(r"iterator_types\s*=\s*\[([^\]]*)\]", head)
        if iters is None or any(t.strip() != '"parallel"' for t in iters.group(1).split(",")):
            raise InterpError(f"{op.where()}: linalg.generic: only parallel iterators are supported")
        mi = re.search(r"ins\(([^:]*):[^)]*\)", head)
        mo = re.search(r"outs\(([^:]*):[^)]*\)", head)
        if mi is None or mo is None:
            raise InterpError(f"{op.where()}: linalg.generic without ins/outs")
        ins, outs = _operands(mi.group(1)), _operands(mo.group(1))
        rs, re_ = _region_span(op)
        region = op.full[rs:re_]
        mb = re.search(r"\^bb\d*\(([^)]*)\)\s*:", region)
        if mb is None:
            raise InterpError(f"{op.where()}: linalg.generic: expected a `^bb0(...)` block header")
        bargs = [p.split(":")[0].strip() for p in mb.group(1).split(",")]
        if len(bargs) != len(ins) + len(outs):
            raise InterpError(f"{op.where()}: linalg.generic block has {len(bargs)} args for "
                              f"{len(ins) + len(outs)} operands")
        base = op.start + rs + mb.end()
        fns, term = self.block(base, op.start + re_, terminators=("linalg.yield",))
        if term is None:
            raise InterpError(f"{op.where()}: linalg.generic without linalg.yield")
        ym = re.fullmatch(r"linalg\.yield\s+(.*?)\s*:\s*(.*)", term.text.strip(), re.DOTALL)
        yields = _operands(ym.group(1))
        if len(yields) != len(outs):
            raise InterpError(f"{term.where()}: {len(yields)} yielded values for {len(outs)} outputs")

        def run(env):
            in_m = [f(env) for f in ins]
            out_m = [f(env) for f in outs]
            shape = out_m[0].shape
            if any(x.shape != shape for x in in_m + out_m):
                raise InterpError(f"linalg.generic operand shapes differ: {[x.shape for x in in_m + out_m]}")
            local = dict(env)
            for name, x in zip(bargs, in_m + out_m):
                local[name] = x.data  # whole arrays: the body is evaluated elementwise by numpy
            for fn in fns:
                fn(local)
            for y, o in zip(yields, out_m):
                o.data[:] = np.broadcast_to(y(local), o.data.shape)
                o.written = True
        return run

    # -- scf.for --------------------------------------------------------------------------------------------
    def _for(self, op):
        rs, re_ = _region_span(op)
        head = op.text[:len(op.text) - (len(op.full) - rs) - 1].strip()
        m = re.fullmatch(rf"scf\.for\s+({_SSA})\s*=\s*(\S+)\s+to\s+(\S+)\s+step\s+(\S+)"
                         rf"(?:\s+iter_args\((.*?)\)\s*->\s*\((.*?)\))?(?:\s*:\s*\w+)?", head, re.DOTALL)
        if m is None:
            raise InterpError(f"{op.where()}: unsupported scf.for form")
        iv = m.group(1)
        lb, ub, step = (_operand(m.group(i)) for i in (2, 3, 4))
        carried, inits = [], []
        if m.group(5):
            for pair in mt.split_top_level(m.group(5)):
                a, b = pair.split("=")
                carried.append(a.strip())
                inits.append(_operand(b))
        if len(op.results) != len(carried):
            raise InterpError(f"{op.where()}: {len(op.results)} results for {len(carried)} iter_args")
        fns, term = self.block(op.start + rs, op.start + re_, terminators=("scf.yield",))
        yields = []
        if term is not None:
            ym = re.fullmatch(r"scf\.yield(?:\s+(.*?)\s*:\s*(.*))?", term.text.strip(), re.DOTALL)
            yields = _operands(ym.group(1) or "")
        if len(yields) != len(carried):
            raise InterpError(f"{op.where()}: scf.yield gives {len(yields)} values for {len(carried)} iter_args")
        results = op.results

        def run(env):
            lo, hi, st = lb(env), ub(env), step(env)
            if st <= 0:
                raise InterpError(f"{op.where()}: scf.for step {st} must be positive")
            vals = [f(env) for f in inits]
            for i in range(lo, hi, st):
                env[iv] = i
                for name, v in zip(carried, vals):
                    env[name] = v
                for fn in fns:
                    fn(env)
                if yields:
                    vals = [y(env) for y in yields]
            for name, v in zip(results, vals):
                env[name] = v
        return run

    # -- AIR regions ----------------------------------------------------------------------------------------
    def _air_region(self, op):
        air = mt.parse_air_op(op.full)
        if air.is_async or air.deps:
            raise InterpError(f"{op.where()}: async {air.name} is not supported")
        if air.region is None:
            raise InterpError(f"{op.where()}: {air.name} without a region")
        rs, re_ = air.region
        fns, _ = self.block(op.start + rs + 1, op.start + re_ - 1,
                            terminators=("air.launch_terminator", "air.segment_terminator",
                                         "air.herd_terminator"))
        ids = ["%" + i for i in air.ids]
        sizes = [("%" + s, _operand("%" + v)) for s, v in air.sizes]
        args = [("%" + inner, _operand("%" + outer)) for inner, outer in air.args]
        is_herd = air.name == "air.herd"
        is_segment = air.name == "air.segment"
        state_ref = self

        def run(env):
            extents = [f(env) for _, f in sizes]
            base = {name: v for (name, _), v in zip(sizes, extents)}
            for name, f in args:
                base[name] = f(env)
            for point in np.ndindex(*extents) if extents else [()]:
                local = dict(base)  # isolated from above: only ids, sizes and args are visible
                for name, v in zip(ids, point):
                    local[name] = int(v)
                if is_herd:
                    state_ref.state.stats.tiles += 1
                    state_ref.state.l1_live = 0
                for fn in fns:
                    fn(local)
                if is_segment:
                    left = state_ref.state.pending_puts()
                    if left:
                        raise InterpError(f"{op.where()}: air.segment ends with unconsumed channel data: "
                                          f"{', '.join(left[:4])} (the device would hang)")
        return run


def _hex_float(lit: str, ty: str):
    bits = int(lit, 16)
    if ty == "f32":
        return np.array([bits], dtype=np.uint32).view(F32)[0]
    if ty == "bf16":
        return np.array([bits], dtype=np.uint16).view(BF16)[0]
    return np.array([bits], dtype=np.uint64).view(np.float64)[0]


# ------------------------------------------------------------------------------------------------ program

@dataclass
class Program:
    name: str
    arg_names: list[str]
    arg_types: list[MemRefType]
    body: list[Fn]
    compiler: _Compiler
    last_stats: Stats | None = None

    def run(self, args: list[np.ndarray]) -> Stats:
        """Execute on flat arrays (one per function argument, in its element dtype), modified in place.
        Returns the run's Stats (run_memrefs also returns the memrefs, whose `written` flags say which
        arguments the run wrote)."""
        return self.run_memrefs(self.wrap(args))[1]

    def wrap(self, args: list[np.ndarray]) -> list[MemRef]:
        if len(args) != len(self.arg_types):
            raise InterpError(f"{self.name}: {len(args)} arguments for {len(self.arg_types)} parameters")
        out = []
        for name, t, a in zip(self.arg_names, self.arg_types, args):
            a = np.asarray(a)
            if a.size != t.size or a.dtype != DTYPES[t.dtype]:
                raise InterpError(f"{self.name}: argument {name} is {a.size}x{a.dtype}, expected "
                                  f"{t.shape} {t.dtype}")
            flat = a.reshape(-1)
            if not np.shares_memory(flat, a) and a.size:
                raise InterpError(f"{self.name}: argument {name} must be contiguous (it is updated in place)")
            out.append(MemRef(flat, t.shape, t.dtype, t.space, name))
        return out

    def run_memrefs(self, mems: list[MemRef]) -> tuple[list[MemRef], Stats]:
        state = _State()
        self.compiler.state = state
        env: Env = {name: m for name, m in zip(self.arg_names, mems)}
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            for fn in self.body:
                fn(env)
        left = state.pending_puts()
        if left:
            raise InterpError(f"{self.name}: channel data never consumed: {', '.join(left[:4])}")
        self.last_stats = state.stats
        return mems, state.stats


def _channel_decls(others) -> dict[str, tuple[tuple[int, ...], tuple[int, ...]]]:
    try:
        return air_ops.channel_decls(others)
    except ValueError as e:
        raise InterpError(str(e)) from None


def compile_module(text: str) -> Program:
    """Parse a module's text (exactly one public func.func) into a runnable Program."""
    module = mt.parse_module(text)
    try:
        func = module.the_public_func()
    except ValueError as e:
        raise InterpError(str(e)) from None
    base = text.find(func.text)
    if base < 0:
        raise InterpError(f"func.func @{func.name}: cannot locate its text")
    names, types = [], []
    for i, (name, ty) in enumerate(func.params):
        if name is None:
            raise InterpError(f"func.func @{func.name}: argument {i} has no name")
        try:
            types.append(parse_memref_type(ty))
        except ValueError as e:
            raise InterpError(f"func.func @{func.name}: argument %{name}: {e}") from None
        names.append("%" + name)
    ctx = _Ctx(text)
    comp = _Compiler(ctx, _channel_decls(module.others))
    fns, _ = comp.block(base + func.body[0], base + func.body[1], terminators=("return", "func.return"))
    return Program(func.name, names, types, fns, comp)
