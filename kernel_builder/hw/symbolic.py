"""Symbolic index values: what the hardware model knows of an `index` SSA value without running anything.

An `Expr` is either affine in named variables (launch ids, herd tile ids, loop induction variables) with
integer coefficients, or a non-affine tree (div/rem, products of variables, min/max, opaque values) that
still records which variables it depends on. That is enough to decide, statically:
- whether a DMA access depends on a herd tile id (broadcast or not),
- whether an enclosing loop's iv enters an offset affinely (the shim BD can fold the loop) or not,
- a loop's trip count once the variables its bounds use are bound (`evaluate`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping


@dataclass(frozen=True)
class Expr:
    const: int = 0
    terms: tuple[tuple[str, int], ...] = ()   # affine part: sorted (variable, coefficient), coefficient != 0
    op: str | None = None                     # non-affine node: "sum" | "mul" | "div" | "floordiv" | "rem" | "min" | "max" | "opaque"
    args: tuple["Expr", ...] = ()
    deps: frozenset[str] = frozenset()        # for "opaque": the variables it depends on

    # ---- queries
    @property
    def is_affine(self) -> bool:
        return self.op is None

    @property
    def variables(self) -> frozenset[str]:
        if self.op is None:
            return frozenset(v for v, _ in self.terms)
        out = set(self.deps)
        for a in self.args:
            out |= a.variables
        return frozenset(out)

    @property
    def value(self) -> int | None:
        """The constant value, or None when the expression depends on a variable."""
        return self.const if self.op is None and not self.terms else None

    def coefficient(self, var: str) -> int:
        """Coefficient of `var` in an affine expression (0 when absent)."""
        assert self.op is None
        return dict(self.terms).get(var, 0)

    def affine_in(self, var: str) -> bool:
        """True when `var` enters only through the affine part (or not at all)."""
        if self.op is None:
            return True
        return var not in self.variables

    def evaluate(self, env: Mapping[str, int]) -> int | None:
        if self.op is None:
            total = self.const
            for v, c in self.terms:
                if v not in env:
                    return None
                total += c * env[v]
            return total
        if self.op == "opaque":
            return None
        vals = [a.evaluate(env) for a in self.args]
        if any(v is None for v in vals):
            return None
        a, b = vals
        if self.op == "sum":
            return a + b
        if self.op == "mul":
            return a * b
        if self.op in ("div", "rem"):
            if b == 0:
                return None
            q = abs(a) // abs(b) if (a >= 0) == (b >= 0) else -(abs(a) // abs(b))
            return q if self.op == "div" else a - q * b
        if self.op == "floordiv":
            return a // b if b else None
        if self.op == "min":
            return min(a, b)
        if self.op == "max":
            return max(a, b)
        return None

    def substitute(self, env: Mapping[str, "Expr"]) -> "Expr":
        """Replace variables by expressions (region arguments crossing launch/segment/herd boundaries)."""
        if self.op is None:
            out = const(self.const)
            for v, c in self.terms:
                out = add(out, mul(env.get(v, var(v)), const(c)))
            return out
        if self.op == "opaque":
            deps = set()
            for d in self.deps:
                deps |= env[d].variables if d in env else {d}
            return Expr(op="opaque", deps=frozenset(deps))
        return _node(self.op, *(a.substitute(env) for a in self.args))

    def __str__(self) -> str:
        if self.op is None:
            parts = [f"{c}*{v}" if c != 1 else v for v, c in self.terms]
            if self.const or not parts:
                parts.append(str(self.const))
            return " + ".join(parts)
        if self.op == "opaque":
            return f"opaque({', '.join(sorted(self.deps))})"
        return f"{self.op}({', '.join(map(str, self.args))})"


def const(v: int) -> Expr:
    return Expr(const=int(v))


def var(name: str) -> Expr:
    return Expr(terms=((name, 1),))


def opaque(deps=()) -> Expr:
    return Expr(op="opaque", deps=frozenset(deps))


def _node(op: str, a: Expr, b: Expr) -> Expr:
    if a.value is not None and b.value is not None:
        folded = Expr(op=op, args=(a, b)).evaluate({})
        if folded is not None:
            return const(folded)
    return Expr(op=op, args=(a, b))


def add(a: Expr, b: Expr) -> Expr:
    if a.op is None and b.op is None:
        terms = dict(a.terms)
        for v, c in b.terms:
            terms[v] = terms.get(v, 0) + c
        return Expr(const=a.const + b.const, terms=tuple(sorted((v, c) for v, c in terms.items() if c)))
    return _node("sum", a, b)


def neg(a: Expr) -> Expr:
    return mul(a, const(-1))


def sub(a: Expr, b: Expr) -> Expr:
    return add(a, neg(b))


def mul(a: Expr, b: Expr) -> Expr:
    for x, y in ((a, b), (b, a)):
        k = y.value
        if k is not None and x.op is None:
            return Expr(const=x.const * k, terms=tuple((v, c * k) for v, c in x.terms if c * k))
    return _node("mul", a, b)


def _consts(a: Expr, b: Expr) -> tuple[int, int] | None:
    x, y = a.value, b.value
    return (x, y) if x is not None and y not in (None, 0) else None


# arith.divui / remui of a non-constant stay non-affine even when they could cancel ((g*576)/576): the
# lowering does not simplify them either (air-opt-shim-dma-bds reports 'unknown ssa offset producer, NYI' on
# exactly that offset, and a 64-row add / SwiGLU whose row loop computes (row, col) that way gets a shim task
# that repeats its first row: docs/hardware-model.md, "Rules").
def div(a: Expr, b: Expr) -> Expr:
    c = _consts(a, b)
    return const(c[0] // c[1]) if c else _node("div", a, b)


def floordiv(a: Expr, b: Expr) -> Expr:
    return div(a, b) if _consts(a, b) else _node("floordiv", a, b)


def rem(a: Expr, b: Expr) -> Expr:
    c = _consts(a, b)
    return const(c[0] % c[1]) if c else _node("rem", a, b)


def minimum(a: Expr, b: Expr) -> Expr:
    return _node("min", a, b)


def maximum(a: Expr, b: Expr) -> Expr:
    return _node("max", a, b)
