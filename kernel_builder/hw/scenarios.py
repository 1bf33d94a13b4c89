"""The three cost scenarios - optimistic, likely, pessimistic - built from the ranges every `CostParams` field
declares in its metadata (kernel_builder/hw/cost.py: kind, source, optimistic and pessimistic values; the
default is the likely one). The optimistic end of every parameter is the one that makes a launch faster, so
each module's time is ordered optimistic <= likely <= pessimistic (tests/test_hw_scenarios.py).
"""
from __future__ import annotations

from dataclasses import fields, replace

from kernel_builder.hw.cost import KINDS, PARAMS, CostParams

SCENARIOS = ("likely", "optimistic", "pessimistic")   # likely first, as every printed figure lists them


def scenario_params(name: str, base: CostParams = PARAMS) -> CostParams:
    """The CostParams of one scenario: `base` (the likely values) with every field at its `name` end."""
    if name not in SCENARIOS:
        raise ValueError(f"unknown cost scenario {name!r}; expected one of {', '.join(SCENARIOS)}")
    if name == "likely":
        return base
    return replace(base, **{f.name: f.metadata[name] for f in fields(CostParams)})


def all_scenarios(base: CostParams = PARAMS) -> dict[str, CostParams]:
    return {name: scenario_params(name, base) for name in SCENARIOS}


def parameter_table(cls=CostParams) -> list[tuple[str, object, object, object, str, str]]:
    """[(name, likely, optimistic, pessimistic, kind, source)] for every cost parameter (docs/hardware-model.md
    prints it). Raises ValueError for a field without a kind or a source: an untagged parameter is a bug."""
    rows = []
    likely = cls()
    for f in fields(cls):
        md = f.metadata
        kind, source = md.get("kind"), str(md.get("source", "")).strip()
        if kind not in KINDS or not source or "optimistic" not in md or "pessimistic" not in md:
            raise ValueError(f"cost parameter {f.name} has no kind ({', '.join(KINDS)}), source and range")
        rows.append((f.name, getattr(likely, f.name), md["optimistic"], md["pessimistic"], kind, source))
    return rows
