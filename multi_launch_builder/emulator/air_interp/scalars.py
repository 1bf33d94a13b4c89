"""`arith` / `math` scalar ops of the AIR interpreter: constants, binary ops, casts, unary math, compares and
select, on scalars or (inside a `linalg.generic` body) whole arrays; floats are rounded (RNE) to their type."""
from __future__ import annotations

import re

import numpy as np

from kernel_builder.numerics import BF16
from multi_launch_builder.emulator.air_interp.values import F32, InterpError, _SSA, _operand

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


def _hex_float(lit: str, ty: str):
    bits = int(lit, 16)
    if ty == "f32":
        return np.array([bits], dtype=np.uint32).view(F32)[0]
    if ty == "bf16":
        return np.array([bits], dtype=np.uint16).view(BF16)[0]
    return np.array([bits], dtype=np.uint64).view(np.float64)[0]


class ScalarOps:
    """The arith / math ops of `program._Compiler`."""

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
