"""Counting without running: how often each node of a region executes, from symbolic loop trip counts.

A loop whose body contains no loop bound depending on its induction variable is counted once and
multiplied by its trip count; only loops whose inner bounds depend on the iv (a causal attention K loop
bounded by the query block) are enumerated, and then only over the iv values, never over data. Regions
(segments, herds) are not entered: the analyzer counts each region instance itself.
"""
from __future__ import annotations

import itertools
from collections import Counter

from kernel_builder.hw.ir import Block, HwParseError, Loop, Node, Region

MAX_ENUMERATED = 2_000_000   # loop iterations enumerated per count (a guard against pathological texts)


def trip_count(loop: Loop, env: dict) -> int | None:
    lb, ub, step = (e.evaluate(env) for e in (loop.lb, loop.ub, loop.step))
    if lb is None or ub is None or step is None:
        return None
    if step <= 0:
        raise HwParseError(f"line {loop.line}: scf.for step {step} must be positive")
    return max(0, -(-(ub - lb) // step))


def static_trip(loop: Loop) -> int | None:
    """The trip count when the bounds are constants, else None."""
    return trip_count(loop, {})


def bound_vars(block: Block, _cache: dict = {}) -> frozenset[str]:  # noqa: B006 - identity cache
    """Variables any loop bound inside `block` (not crossing regions) depends on."""
    key = id(block)
    hit = _cache.get(key)
    if hit is not None and hit[0] is block:
        return hit[1]
    out: set[str] = set()
    for n in block.nodes:
        if isinstance(n, Loop):
            for e in (n.lb, n.ub, n.step):
                out |= e.variables
            out |= bound_vars(n.body)
    res = frozenset(out)
    _cache[key] = (block, res)
    return res


class _Budget:
    def __init__(self):
        self.left = MAX_ENUMERATED

    def spend(self, n: int, line: int) -> None:
        self.left -= n
        if self.left < 0:
            raise HwParseError(f"line {line}: too many loop iterations to enumerate (bounds depend on "
                               f"enclosing induction variables over more than {MAX_ENUMERATED} iterations)")


def count(block: Block, env: dict, mult: int = 1, out: Counter | None = None, budget: _Budget | None = None
          ) -> Counter:
    """{node: executions} for one execution of `block` with the variables in `env` bound."""
    out = Counter() if out is None else out
    budget = budget or _Budget()
    for n in block.nodes:
        out[n] += mult
        if isinstance(n, Loop):
            trip = trip_count(n, env)
            if trip is None:
                raise HwParseError(f"line {n.line}: cannot count the trips of this scf.for: its bounds depend on "
                                   f"{sorted(set().union(*(e.variables for e in (n.lb, n.ub, n.step))) - set(env))}")
            if trip == 0:
                continue
            if n.iv in bound_vars(n.body):
                budget.spend(trip, n.line)
                lb, step = n.lb.evaluate(env), n.step.evaluate(env)
                for i in range(trip):
                    count(n.body, {**env, n.iv: lb + i * step}, mult, out, budget)
            else:
                count(n.body, env, mult * trip, out, budget)
    return out


def region_instances(region: Region, env: dict) -> list[tuple[dict, int]]:
    """How to count a region's body: [(env with the ids bound, multiplicity)]. Per instance when a loop bound
    inside depends on an id (e.g. a causal attention herd), else once with the ids left free."""
    need = bound_vars(region.body) & set(region.ids)
    if not need:
        return [(env, region.n_instances)]
    out = []
    for point in itertools.product(*[range(s) for s in region.sizes]):
        out.append(({**env, **dict(zip(region.ids, point))}, 1))
    return out


def enclosing(block: Block, target: Node, path: tuple = ()) -> tuple[Loop, ...] | None:
    """The loops (outermost first) enclosing `target` inside `block` (regions not crossed)."""
    for n in block.nodes:
        if n is target:
            return path
        if isinstance(n, Loop):
            r = enclosing(n.body, target, path + (n,))
            if r is not None:
                return r
    return None


def loop_paths(block: Block, path: tuple = (), out: dict | None = None) -> dict:
    """{node: enclosing loops (outermost first)} for every node of `block`, regions not crossed."""
    out = {} if out is None else out
    for n in block.nodes:
        out[n] = path
        if isinstance(n, Loop):
            loop_paths(n.body, path + (n,), out)
    return out
