"""LM head: logits = W_lm @ x as n_parts GEMV launches over vocabulary partitions (kernel_builder.planner
.plan_lm_head). The runtime pads the vocabulary with zero rows up to n_parts * part_rows."""
from __future__ import annotations

from kernel_builder.planner import plan_lm_head
from multi_launch_builder import kernel
from multi_launch_builder.decl import Arg, Launch, ModuleDecl, Role
from multi_launch_builder.shapes import ModelShapes


def lm_head_gemv(shapes: ModelShapes) -> ModuleDecl:
    h = shapes.hidden
    plan = plan_lm_head(shapes.vocab, h)
    rows = plan.part_rows
    args = [Arg("x", (1, h), Role.INPUT)]
    launches = []
    for p in range(plan.n_parts):
        args += [Arg(f"w_{p}", (rows, h), Role.STATIC), Arg(f"logits_{p}", (1, rows), Role.OUTPUT)]
        launches.append(Launch(f"part{p}", kernel("gemv", rows, h), (f"w_{p}", "x", f"logits_{p}")))
    return ModuleDecl(name="lm_head_gemv", args=tuple(args), launches=tuple(launches))
