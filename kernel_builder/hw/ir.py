"""The AIR module text as a small tree the hardware model can count on: launches, segments, herds, loops,
allocations, transfers (DMAs and channel put/get), external calls and compute ops, with every index value
kept symbolic (kernel_builder.hw.symbolic). Nothing is executed.

It is built from the one AIR reader's tree (kernel_builder.air_module: module layout, ops split once, AIR op
headers, channel declarations) and air_ops' access patterns and memref types - the tree the interpreter reads.
The node classes live in kernel_builder.hw.ir_nodes (re-exported here). `parse(text)` raises HwParseError (one
line naming the op and its line) for text outside that subset.
"""
from __future__ import annotations

import itertools
import re

from kernel_builder import air_module, air_ops
from kernel_builder import mlir_text as mt
from kernel_builder.air_module import Op
from kernel_builder.hw import symbolic as sym
from kernel_builder.hw.ir_nodes import (L1, L2, L3, Access, Alloc, Block, Buffer, Call, Compute, HwParseError, Loop,  # noqa: F401
                                        Module, Node, Region, Transfer, walk)
from kernel_builder.hw.symbolic import Expr


_FLOAT_OPS = {"arith.addf", "arith.subf", "arith.mulf", "arith.divf", "arith.maximumf", "arith.minimumf",
              "arith.maxnumf", "arith.minnumf", "arith.negf", "arith.extf", "arith.truncf", "arith.cmpf",
              "arith.select", "math.rsqrt", "math.sqrt", "math.exp", "math.tanh", "math.log", "math.absf",
              "math.erf", "arith.sitofp", "arith.uitofp", "arith.fptosi", "arith.fptoui"}
_SOFT_FLOAT_CALLS = {"arith.divf", "math.rsqrt", "math.sqrt"}
_INT_BINARY = {"arith.addi": sym.add, "arith.subi": sym.sub, "arith.muli": sym.mul,
               "arith.divui": sym.div, "arith.divsi": sym.div, "arith.remui": sym.rem, "arith.remsi": sym.rem,
               "arith.floordivsi": sym.floordiv, "arith.ceildivsi": sym.floordiv, "arith.ceildivui": sym.floordiv,
               "arith.minsi": sym.minimum, "arith.minui": sym.minimum, "arith.maxsi": sym.maximum,
               "arith.maxui": sym.maximum}
_CASTS = {"arith.index_cast", "arith.index_castui", "arith.extsi", "arith.extui", "arith.trunci"}
_TERMINATORS = {"air.launch_terminator", "air.segment_terminator", "air.herd_terminator", "scf.yield",
                "linalg.yield", "return", "func.return"}
_IGNORED = {"memref.dealloc", "air.wait_all"}
_INT_RE = re.compile(r"-?\d+")
_RANGE_RE = re.compile(r"\{[^}]*llama_npu\.range\s*=\s*\[\s*(-?\d+)\s*,\s*(-?\d+)\s*\][^}]*\}")


class _Parser:
    def __init__(self):
        self.counter = itertools.count()
        self.ranges: dict[str, tuple[int, int]] = {}

    def fresh(self, prefix: str) -> str:
        return f"{prefix}#{next(self.counter)}"

    # -- values
    @staticmethod
    def value(env: dict, tok: str, op: Op):
        tok = tok.strip()
        if _INT_RE.fullmatch(tok):
            return sym.const(int(tok))
        if tok not in env:
            raise HwParseError(f"{op.where()}: value {tok} is not defined in this region")
        return env[tok]

    def index(self, env: dict, tok: str, op: Op) -> Expr:
        v = self.value(env, tok, op)
        if not isinstance(v, Expr):
            raise HwParseError(f"{op.where()}: {tok} is not an index value")
        return v

    def constant(self, env: dict, tok: str, op: Op, what: str) -> int:
        v = self.index(env, tok, op).value
        if v is None:
            raise HwParseError(f"{op.where()}: {what} {tok} must be a constant")
        return v

    def access(self, env: dict, text: str, op: Op) -> Access:
        parts = air_ops.access_pattern(text)
        if parts is None:
            raise HwParseError(f"{op.where()}: cannot read access pattern {text.strip()!r}")
        buf, offs, sizes, strides = parts
        b = self.value(env, buf, op)
        if not isinstance(b, Buffer):
            raise HwParseError(f"{op.where()}: {buf} is not a memref")
        if not (len(offs) == len(sizes) == len(strides)):
            raise HwParseError(f"{op.where()}: offsets/sizes/strides of {buf} differ in length")
        if not offs:  # whole buffer, contiguous
            return Access(b, [sym.const(0)], [b.type.size], [1])
        return Access(b, [self.index(env, o, op) for o in offs],
                      [self.constant(env, s, op, "DMA size") for s in sizes],
                      [self.constant(env, s, op, "DMA stride") for s in strides])

    # -- blocks
    def block(self, ops: air_module.Block, env: dict) -> Block:
        blk = Block()
        for op in ops:
            if op.name in _TERMINATORS or not op.name:
                continue
            try:
                node = self.op(op, env)
            except HwParseError:
                raise
            except (ValueError, KeyError, IndexError) as e:
                raise HwParseError(f"{op.where()}: {e}") from None
            if node is not None:
                blk.nodes.append(node)
        return blk

    def op(self, op: Op, env: dict) -> Node | None:
        name = op.name
        if name == "scf.for":        # region ops first: no copy of their text is held while the body is read
            return self.loop(op, env)
        if name in mt.AIR_REGION_OPS:
            return self.region(op, env)
        text = op.text.strip()
        if name == "arith.constant":
            m = re.fullmatch(r"arith\.constant\s+(\S+)\s*:\s*(\w+)", text)
            if m and (m.group(2) == "index" or re.fullmatch(r"i\d+", m.group(2))):
                lit = m.group(1)
                env[op.results[0]] = sym.const(int(lit, 0)) if lit not in ("true", "false") else \
                    sym.const(int(lit == "true"))
            else:
                env[op.results[0]] = None  # a float constant
            return None
        if name in _INT_BINARY:
            m = re.fullmatch(rf"{re.escape(name)}\s+({air_ops.SSA})\s*,\s*({air_ops.SSA})\s*(?:\{{[^}}]*\}}\s*)?:"
                             rf"\s*(\w+)", text)
            if m is None:
                raise HwParseError(f"{op.where()}: unsupported {name} form")
            a, b = (self.value(env, m.group(i), op) for i in (1, 2))
            env[op.results[0]] = _INT_BINARY[name](a, b) if isinstance(a, Expr) and isinstance(b, Expr) \
                else sym.opaque()
            return None
        if name in _CASTS:
            m = re.fullmatch(rf"{re.escape(name)}\s+({air_ops.SSA})\s*:.*", text)
            env[op.results[0]] = self.value(env, m.group(1), op) if m else sym.opaque()
            return None
        if name in _FLOAT_OPS or name in ("memref.load", "memref.store"):
            return self.scalar(op, env, text)
        if name == "memref.alloc":
            m = re.fullmatch(r"memref\.alloc\(\)\s*:\s*(memref<.*>)", text, re.DOTALL)
            if m is None:
                raise HwParseError(f"{op.where()}: only `memref.alloc() : memref<static shape>` is supported")
            b = Buffer(op.results[0], air_ops.parse_memref_type(m.group(1)), op.line)
            env[op.results[0]] = b
            return Alloc(op.line, b)
        if name in _IGNORED:
            return None
        if name == "air.dma_memcpy_nd":
            sides = air_ops.dma_sides(op)
            if sides is None:
                raise HwParseError(f"{op.where()}: expected a synchronous `air.dma_memcpy_nd (dst..., src...)`")
            return Transfer(op.line, "dma", self.access(env, sides[0], op), self.access(env, sides[1], op))
        if name in ("air.channel.put", "air.channel.get"):
            m = air_ops.CHANNEL_RE.fullmatch(text)
            if m is None:
                raise HwParseError(f"{op.where()}: unsupported {name} form")
            kind, chan = m.group(1), m.group(2)
            idx = [self.index(env, t, op) for t in m.group(3).split(",") if t.strip()]
            acc = self.access(env, m.group(4), op)
            return Transfer(op.line, kind, acc if kind == "get" else None, acc if kind == "put" else None,
                            chan, idx)
        if name == "func.call":
            m = re.fullmatch(r"func\.call\s+@([\w$.]+)\((.*?)\)\s*:.*", text, re.DOTALL)
            if m is None:
                raise HwParseError(f"{op.where()}: unsupported func.call form")
            args = [self.value(env, a, op) for a in m.group(2).split(",") if a.strip()]
            for r in op.results:
                env[r] = None
            return Call(op.line, m.group(1), args)
        if name in ("linalg.fill", "linalg.matmul", "linalg.generic"):
            return self.linalg(op, env)
        # anything else: results are opaque index values depending on every index operand
        deps = set()
        for t in re.findall(air_ops.SSA, text):
            v = env.get(t)
            if isinstance(v, Expr):
                deps |= v.variables
        for r in op.results:
            env[r] = sym.opaque(deps)
        return None

    def scalar(self, op: Op, env: dict, text: str) -> Compute:
        """A scalar float op or a memref.load / store: its buffer read or written; a load with a
        `llama_npu.range` is a variable of that range."""
        name = op.name
        reads, writes = [], []
        m = re.search(rf"({air_ops.SSA})\[", text)
        if m is not None:
            b = env.get(m.group(1))
            if isinstance(b, Buffer):
                (writes if name == "memref.store" else reads).append(b)
        for r in op.results:
            env[r] = None
        rng = _RANGE_RE.search(text) if name == "memref.load" else None
        if rng is not None and len(op.results) == 1:
            # a loaded integer the builder bounds (e.g. the attention position): a variable of known range
            lo, hi = int(rng.group(1)), int(rng.group(2))
            if lo > hi:
                raise HwParseError(f"{op.where()}: llama_npu.range [{lo}, {hi}] is empty")
            v = self.fresh(f"range:{op.results[0]}")
            self.ranges[v] = (lo, hi)
            env[op.results[0]] = sym.var(v)
        return Compute(op.line, "scalar", 1 if name in _FLOAT_OPS else 0, reads, writes,
                       divf=name in _SOFT_FLOAT_CALLS)

    def linalg(self, op: Op, env: dict) -> Compute:
        text = op.text
        ins = re.search(r"\bins\(([^:)]*)", text)
        outs = re.search(r"\bouts\(([^:)]*)", text)
        bufs = lambda m: [env[t] for t in re.findall(air_ops.SSA, m.group(1)) if isinstance(env.get(t), Buffer)] \
            if m else []  # noqa: E731
        reads, writes = bufs(ins), bufs(outs)
        if op.name == "linalg.matmul":
            if len(reads) != 2 or len(writes) != 1:
                raise HwParseError(f"{op.where()}: linalg.matmul on memrefs expected")
            (m_, k_), (_, n_) = reads[0].type.shape, reads[1].type.shape
            return Compute(op.line, "matmul", m_ * n_ * k_, reads + writes, writes)
        elems = writes[0].type.size if writes else 0
        if op.name == "linalg.fill":
            return Compute(op.line, "fill", elems, reads, writes)
        names = [o.name for o in op.body if o.results]
        n_ops = sum(1 for n in names if n in _FLOAT_OPS)
        divf = any(n in _SOFT_FLOAT_CALLS for n in names)
        return Compute(op.line, "generic", elems * max(1, n_ops), reads, writes, divf=divf)

    def loop(self, op: Op, env: dict) -> Loop:
        if op.span is None:
            raise HwParseError(f"{op.where()}: scf.for without a region")
        head = op.head
        m = re.fullmatch(rf"scf\.for\s+({air_ops.SSA})\s*=\s*(\S+)\s+to\s+(\S+)\s+step\s+(\S+)"
                         rf"(?:\s+iter_args\((.*?)\)\s*->\s*\((.*?)\))?(?:\s*:\s*\w+)?", head, re.DOTALL)
        if m is None:
            raise HwParseError(f"{op.where()}: unsupported scf.for form")
        lb, ub, step = (self.index(env, m.group(i), op) for i in (2, 3, 4))
        iv = self.fresh(m.group(1))
        inner = dict(env)
        inner[m.group(1)] = sym.var(iv)
        if m.group(5):
            for pair in mt.split_top_level(m.group(5)):
                inner[pair.split("=")[0].strip()] = None
        for r in op.results:
            env[r] = None
        body = self.block(op.body, inner)
        return Loop(op.line, iv, lb, ub, step, body)

    def region(self, op: Op, env: dict) -> Region:
        air = op.air
        if air.is_async or air.deps:
            raise HwParseError(f"{op.where()}: async {air.name} is not supported")
        if air.region is None:
            raise HwParseError(f"{op.where()}: {air.name} without a region")
        kind = air.name.split(".")[1]
        inner: dict = {}
        ids = []
        sizes = []
        for (size_name, operand), id_name in zip(air.sizes, air.ids):
            n = self.constant(env, "%" + operand, op, f"{kind} size")
            sizes.append(n)
            inner["%" + size_name] = sym.const(n)
            v = self.fresh(f"{kind}:{id_name}")
            ids.append(v)
            inner["%" + id_name] = sym.var(v)
        for a, operand in air.args:
            inner["%" + a] = self.value(env, "%" + operand, op)
        body = self.block(op.body, inner)
        attrs, symbol = air.attributes, air.symbol
        return Region(op.line, kind, symbol, ids, sizes, body, attrs)


def parse(text: str) -> Module:
    """The module's single public func as a tree of launches (a bare herd is treated as a launch holding one
    segment holding the herd, as the stitcher and air-insert-launch-around-herd wrap it)."""
    tree = air_module.read(text)
    try:
        fname, params = tree.func.name, tree.func.params
        channels = tree.channels
        externals = dict(tree.externals)
    except ValueError as e:
        raise HwParseError(str(e)) from None
    p = _Parser()
    env: dict = {}
    args = []
    for i, (name, ty) in enumerate(params):
        if name is None:
            raise HwParseError(f"func.func @{fname}: argument {i} has no name")
        try:
            b = Buffer("%" + name, air_ops.parse_memref_type(ty), 0)
        except ValueError as e:
            raise HwParseError(f"func.func @{fname}: argument %{name}: {e}") from None
        env["%" + name] = b
        args.append(b)
    try:
        ops = tree.body
    except ValueError as e:
        raise HwParseError(str(e)) from None
    body = p.block(ops, env)
    launches = []
    for node in body.nodes:
        if isinstance(node, Region) and node.kind == "launch":
            launches.append(node)
        elif isinstance(node, Region) and node.kind == "herd":
            seg = Region(node.line, "segment", None, [], [], Block([node]), {})
            launches.append(Region(node.line, "launch", None, [], [], Block([seg]), node.attributes))
        elif isinstance(node, Region):
            raise HwParseError(f"line {node.line}: air.{node.kind} outside an air.launch")
    if not launches:
        raise HwParseError(f"func.func @{fname}: no air.launch or air.herd found")
    return Module(fname, args, launches, channels, externals, p.ranges)
