"""Work of an external call whose cost depends on the values of its integer operands (`ExternalCost.valued` in
kernel_builder/external_costs.py: the attention prefill item, whose primitive skips the K/V tiles and row blocks
past the causal bound). The analyzer (kernel_builder.hw.analyze) adds it to the busiest tile's work; the rule
and its justification: docs/hardware-model.md, "Work"."""
from __future__ import annotations

import itertools
from collections import Counter

from kernel_builder.external_costs import external_cost
from kernel_builder.hw import count as cnt
from kernel_builder.hw.ir import Call, HwParseError, Loop, Region
from kernel_builder.hw.symbolic import Expr


def valued_work(launch: Region, herd: Region, call: Call, loops: tuple[Loop, ...], ranges: dict
                ) -> tuple[Counter, int]:
    """Work of an external call whose cost depends on integer operands (ExternalCost.valued), over the
    launch: those operands evaluated at every launch iteration, herd tile and iteration of the loops around
    the call. A variable of a `llama_npu.range` takes its upper bound (the kernels that read one - the
    attention position - do the most work there: a later query sees more keys). The herd's tiles run in
    step (a broadcast stream moves at the pace of its slowest core), so each call iteration costs its
    busiest tile (per instruction kind); launch iterations add up. Returns (instruction counts incl. "calls",
    scalar ops). Launch and herd ids the operands and loop bounds do not use
    (and the other operands) multiply instead of being enumerated."""
    ec, m = external_cost(call.symbol)
    used = [(i, a) for i, a in enumerate(call.args) if i in ec.valued and isinstance(a, Expr)]
    exprs = [a for _, a in used]
    deps: set[str] = set()
    for e in exprs:
        deps |= e.variables
    for lp in loops:
        for e in (lp.lb, lp.ub, lp.step):
            deps |= e.variables
    top = {v: hi for v, (lo, hi) in ranges.items()}
    la_ids = [(i, n) for i, n in zip(launch.ids, launch.sizes) if i in deps]
    h_ids = [(i, n) for i, n in zip(herd.ids, herd.sizes) if i in deps]
    mult = launch.n_instances
    for _, n in la_ids:
        mult //= n

    def iterations(env: dict, depth: int = 0):
        if depth == len(loops):
            yield env
            return
        lp = loops[depth]
        trip = cnt.trip_count(lp, env)
        if trip is None:    # as count.count: a bound that depends on something unknown is an error
            raise HwParseError(f"line {lp.line}: cannot count the trips of this scf.for")
        lb, step = lp.lb.evaluate(env), lp.step.evaluate(env)
        for i in range(trip):
            yield from iterations({**env, lp.iv: lb + i * step}, depth + 1)

    cache: dict = {}

    def work(env: dict) -> dict:
        vals = tuple(a.evaluate(env) for a in exprs)
        hit = cache.get(vals)
        if hit is None:
            args = list(call.args)
            for (i, a), v in zip(used, vals):
                args[i] = a if v is None else v
            w = ec.work(m, args)
            hit = cache[vals] = {**w.counts, "calls": 1, "scalar_ops": w.scalar_ops}
        return hit

    total: Counter = Counter()
    for lpoint in itertools.product(*[range(n) for _, n in la_ids]):
        lenv = {**top, **{i: v for (i, _), v in zip(la_ids, lpoint)}}
        steps: list[dict] = []      # per call iteration: the busiest tile's work so far, per kind
        for hpoint in itertools.product(*[range(n) for _, n in h_ids]):
            henv = {**lenv, **{i: v for (i, _), v in zip(h_ids, hpoint)}}
            for j, env in enumerate(iterations(henv)):
                w = work(env)
                if j == len(steps):
                    steps.append(dict(w))
                else:
                    steps[j] = {k: max(steps[j].get(k, 0), w.get(k, 0)) for k in set(steps[j]) | set(w)}
        for w in steps:
            for k, v in w.items():
                total[k] += v * mult
    scalar = total.pop("scalar_ops", 0)
    return total, scalar
