"""Per-module-family aircc options: ONE table keyed by module family.

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


# Decode GEMVs stream long weight rows; tiling the runtime loop by 16x16 keeps the shim BD count
# small. o_gemv_ffn holds the down projection (K = ffn): ping-pong does not fit L1 there.
_GEMV = AirccPreset(runtime_loop_tiling_sizes=(16, 16))

PRESETS: dict[str, AirccPreset] = {
    "rms_gemms_rope": AirccPreset(),
    "flash_attn": AirccPreset(),
    "o_ffn": AirccPreset(),
    "rms_gemv_rope": _GEMV,
    "o_gemv_ffn": AirccPreset(runtime_loop_tiling_sizes=(16, 16), omit_pingpong="all"),
    "lm_head_gemv": _GEMV,
}
DEFAULT_PRESET = AirccPreset()


def family_of(module_name: str) -> str | None:
    """Module family = the longest PRESETS key that the module name starts with
    ("rms_gemms_rope_s128" -> "rms_gemms_rope")."""
    best = None
    for fam in PRESETS:
        if module_name == fam or module_name.startswith(fam + "_"):
            if best is None or len(fam) > len(best):
                best = fam
    return best


def preset_for(module_name: str) -> AirccPreset:
    fam = family_of(module_name)
    return PRESETS[fam] if fam else DEFAULT_PRESET
