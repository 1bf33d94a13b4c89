"""aircc options of one module: a field of its declaration (multi_launch_builder.decl.ModuleDecl.preset).

Only flags the native aircc really accepts (tools/aircc/aircc.cpp in mlir-air): ping-pong omission,
runtime loop tiling of shim DMA BDs, the while(true) wrapper, lock race fix, stack size.
"""
from __future__ import annotations

from dataclasses import dataclass

from kernel_builder import air_module
from kernel_builder.air_module import PRESET_COMMENT  # noqa: F401 - the stitcher writes the header with it


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

    @classmethod
    def from_flags(cls, flags: list[str]) -> "AirccPreset":
        """Inverse of flags() (a stitched module records its preset's flags in a header comment)."""
        kw: dict = {"runtime_loop_tiling_sizes": []}
        it = iter(flags)
        for f in it:
            if f == "--omit-while-true-loop":
                kw["omit_while_true_loop"] = True
            elif f.startswith("--omit-ping-pong-transform="):
                kw["omit_pingpong"] = f.split("=", 1)[1]
            elif f.startswith("--air-runtime-loop-tiling-sizes="):
                kw["runtime_loop_tiling_sizes"].append(int(f.split("=", 1)[1]))
            elif f == "--use-lock-race-condition-fix":
                kw["use_lock_race_condition_fix"] = True
            elif f == "--stack-size":
                kw["stack_size"] = int(next(it))
            else:
                raise ValueError(f"unknown aircc preset flag {f!r}")
        kw["runtime_loop_tiling_sizes"] = tuple(kw["runtime_loop_tiling_sizes"])
        return cls(**kw)


def preset_of_text(text: str) -> AirccPreset:
    """The preset a stitched module records in its header (`// aircc preset: <flags>`, read by the one AIR reader:
    kernel_builder.air_module), else the default."""
    flags = air_module.read(text).preset_flags
    return AirccPreset() if flags is None else AirccPreset.from_flags(list(flags))
