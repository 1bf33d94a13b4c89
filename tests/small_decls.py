"""Small real module declarations for the build/cache tests (real kernel builders, tiny shapes)."""
from __future__ import annotations

from functools import partial

from kernel_builder.add import builder as add
from kernel_builder.gemv import builder as gemv
from kernel_builder.rmsnorm import builder as rmsnorm
from multi_launch_builder.decl import Arg, Launch, ModuleDecl, Role
from kernel_builder.presets import AirccPreset

R, D = 4, 64


def add_norm(name: str = "add_norm", eps: float = 1e-5) -> ModuleDecl:
    """x + r -> s (intermediate) -> rmsnorm(s, w) -> y: inputs, a static, an intermediate, an output."""
    return ModuleDecl(name, (
        Arg("x", (R, D), Role.INPUT), Arg("r", (R, D), Role.INPUT), Arg("w", (D,), Role.STATIC),
        Arg("s", (R, D), Role.INTERMEDIATE), Arg("y", (R, D), Role.OUTPUT)),
        (Launch("add", partial(add.build, R, D), ("x", "r", "s")),
         Launch("norm", partial(rmsnorm.build, R, D, eps), ("s", "w", "y"))))


def gemv_mod(name: str = "lm_head_gemv_t", m: int = 64, k: int = 64) -> ModuleDecl:
    """One GEMV with an external kernel (link_with), a static weight and a GEMV aircc preset."""
    return ModuleDecl(name, (
        Arg("w", (m, k), Role.STATIC), Arg("x", (1, k), Role.INPUT), Arg("y", (1, m), Role.OUTPUT)),
        (Launch("gv", partial(gemv.build, m, k), ("w", "x", "y")),),
        preset=AirccPreset(runtime_loop_tiling_sizes=(16, 16)))
