"""aircc options of one module: a field of its declaration (kernel_builder.decl.ModuleDecl.preset).

Only flags the native aircc really accepts (tools/aircc/aircc.cpp in mlir-air): ping-pong omission,
runtime loop tiling of shim DMA BDs, the while(true) wrapper, lock race fix, stack size.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class AirccPreset:
    omit_while_true_loop: bool = False
    omit_pingpong: str = ""                       # "", "L1", "L2" or "all"
    runtime_loop_tiling_sizes: tuple[int, ...] = ()
    use_lock_race_condition_fix: bool = False
    stack_size: int = 1024                        # aircc default; only passed when different

    def flags(self) -> list[str]:
        out: list[str] = []
        if self.omit_while_true_loop:
            out.append("--omit-while-true-loop")
        if self.omit_pingpong:
            if self.omit_pingpong not in ("L1", "L2", "all"):
                raise ValueError(f"omit_pingpong must be '', 'L1', 'L2' or 'all', got {self.omit_pingpong!r}")
            out.append(f"--omit-ping-pong-transform={self.omit_pingpong}")
        out += [f"--air-runtime-loop-tiling-sizes={s}" for s in self.runtime_loop_tiling_sizes]
        if self.use_lock_race_condition_fix:
            out.append("--use-lock-race-condition-fix")
        if self.stack_size != 1024:
            out += ["--stack-size", str(self.stack_size)]
        return out

    def as_dict(self) -> dict:
        return asdict(self)
