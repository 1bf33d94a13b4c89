"""The AIR interpreter's driver: op dispatch and blocks (`_Compiler`, built from the op families of the sibling
modules), `scf.for`, `air.launch` / `air.segment` / `air.herd` (grid iterated, herd tiles one after the other),
and the runnable `Program` that `compile_module(text)` returns."""
from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from kernel_builder import air_module
from kernel_builder import mlir_text as mt
from kernel_builder.air_module import Op
from kernel_builder.air_ops import MemRefType
from multi_launch_builder.emulator.air_interp.channels import ChannelOps
from multi_launch_builder.emulator.air_interp.compute import ComputeOps
from multi_launch_builder.emulator.air_interp.memref_ops import MemoryOps
from multi_launch_builder.emulator.air_interp.scalars import _FLOAT_BINARY, _INT_BINARY, _MATH_UNARY, ScalarOps
from multi_launch_builder.emulator.air_interp.values import (DTYPES, Env, Fn, InterpError, MemRef, Stats, _SSA, _State,
                                                             _operand, _operands, _region_span, parse_memref_type)


class _Compiler(ScalarOps, MemoryOps, ChannelOps, ComputeOps):
    def __init__(self, channels: dict | None = None):
        self.state: _State | None = None  # bound at run time
        self.channels: dict[str, tuple[tuple[int, ...], tuple[int, ...]]] = channels or {}  # sym -> (size, bcast)

    # -- blocks ---------------------------------------------------------------------------------------------
    def block(self, ops: air_module.Block, terminators=()) -> tuple[list[Fn], Op | None]:
        """Compile the ops of a block (the reader's tree: kernel_builder.air_module)."""
        fns, term = [], None
        for op in ops:
            if op.name in terminators:
                term = op
                continue
            fns.append(self._wrap(op, self.op(op)))
        return fns, term

    @staticmethod
    def _wrap(op: Op, fn: Fn) -> Fn:
        def run(env, _fn=fn, _op=op):
            try:
                _fn(env)
            except InterpError:
                raise
            except Exception as e:  # name the op that failed
                raise InterpError(f"{_op.where()}: {type(e).__name__}: {e}") from e
        return run

    def op(self, op: Op) -> Fn:
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

    # -- scf.for --------------------------------------------------------------------------------------------
    def _for(self, op):
        _region_span(op)   # refuses an scf.for without a region
        head = op.head
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
        fns, term = self.block(op.body, terminators=("scf.yield",))
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
        air = op.air
        if air.is_async or air.deps:
            raise InterpError(f"{op.where()}: async {air.name} is not supported")
        if air.region is None:
            raise InterpError(f"{op.where()}: {air.name} without a region")
        fns, _ = self.block(op.body, terminators=("air.launch_terminator", "air.segment_terminator",
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


def compile_module(text: str) -> Program:
    """Compile a module's text (exactly one public func.func; read once: kernel_builder.air_module) into a
    runnable Program."""
    tree = air_module.read(text)
    try:
        func = tree.func
        channels = tree.channels
        body = tree.body
    except ValueError as e:
        raise InterpError(str(e)) from None
    names, types = [], []
    for i, (name, ty) in enumerate(func.params):
        if name is None:
            raise InterpError(f"func.func @{func.name}: argument {i} has no name")
        try:
            types.append(parse_memref_type(ty))
        except ValueError as e:
            raise InterpError(f"func.func @{func.name}: argument %{name}: {e}") from None
        names.append("%" + name)
    comp = _Compiler(channels)
    fns, _ = comp.block(body, terminators=("return", "func.return"))
    return Program(func.name, names, types, fns, comp)
