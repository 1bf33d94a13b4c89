"""aircc presets chosen from the hardware model's numbers (not by hand).

`stack_need(texts)` / `preset_for_kernels(texts)`: the cheap path a model family uses for every module it
declares (the model layer calls it per module): the stack the core code of the module's kernels needs, from the
model's per-family figures (each kernel's external.py COSTS `stack_bytes`, and NPU2.soft_float_div_stack_bytes for
a scalar float division / square root in codegen core code - the same sources the analyzer uses), rounded up to
`STACK_STEP`, and the runtime loop tiling its kernels' launch grids need (`runtime_tiling`: the analyzer on each
kernel text alone, memoised - a GEMM's launch grid keeps one chained C row write per iteration in flight on the
shim BDs; a kernel whose grid fits untiled needs none). The planners keep every kernel inside L1 (with
ping-pong copies and a 4 KiB stack reserve), so no module of ours needs ping-pong omission; the pinned-verdict
test (tests/test_hw_modules.py) runs the full analyzer on every declared module with the preset recorded in it.

`derive_preset(text)` analyses a module with a base preset and sets only what the model says the module needs:
- `stack_size`: the largest stack any launch's core code needs (`Usage.stack_need`: soft-float division /
  invsqrt in core code or in an external kernel, external_costs.py), rounded up to `STACK_STEP`, when it exceeds
  the base's;
- `omit_pingpong`: `"L1"` when L1 overflows only because of ping-pong copies (and the module fits without them).
Everything else stays as in the base preset (runtime loop tiling included: in the model it only folds launch
grids into fewer DMA tasks, it never removes a BD overflow, and no module of ours overflows the shim BDs). The
result is what the module needs; whether it then fits is the model's verdict on it
(`analyze_module(text, preset=derive_preset(text))`).
"""
from __future__ import annotations

import functools
from dataclasses import replace

from kernel_builder import air_module
from kernel_builder.external_costs import external_cost
from kernel_builder.hw.facts import NPU2
from kernel_builder.hw.ir import _SOFT_FLOAT_CALLS, HwParseError
from kernel_builder.presets import AirccPreset

STACK_STEP = 256


def stack_need(texts) -> int:
    """Bytes of stack the core code of these kernel (or module) texts needs: the most any external kernel they
    call needs, and soft-float stack for a scalar division / square root in codegen core code; at least the
    default stack. HwParseError for a text the AIR reader cannot read."""
    need = NPU2.default_stack_bytes
    for text in texts:
        tree = air_module.read(text)   # the one AIR reader: its calls and op names
        try:
            calls, names = tree.called_symbols, tree.result_op_names
        except ValueError as e:
            raise HwParseError(str(e)) from None
        for sym in calls:
            found = external_cost(sym)
            if found is not None:
                need = max(need, found[0].stack_bytes)
        if names & _SOFT_FLOAT_CALLS:
            need = max(need, NPU2.soft_float_div_stack_bytes)
    return need


# Runtime loop tiling sizes tried, coarsest first: 2 x 2 is what mlir-air's GEMM designs use ("BD-ID recycling
# tiling"); 1 x 1 waits after every launch iteration.
RUNTIME_TILINGS: tuple[tuple[int, ...], ...] = ((2, 2), (1, 2), (2, 1), (1, 1))


@functools.lru_cache(maxsize=512)
def runtime_tiling(text: str) -> tuple[int, ...]:
    """The runtime loop tiling one kernel text needs: () when the model counts no shim BD overflow untiled,
    else the coarsest of RUNTIME_TILINGS under which it counts none (the last one when none helps)."""
    from kernel_builder.hw.module_report import analyze_module

    if not _has(analyze_module(text, preset=AirccPreset()), "shim", "BDs"):
        return ()
    for sizes in RUNTIME_TILINGS:
        if not _has(analyze_module(text, preset=AirccPreset(runtime_loop_tiling_sizes=sizes)), "shim", "BDs"):
            return sizes
    return RUNTIME_TILINGS[-1]


def preset_for_kernels(texts, base: AirccPreset | None = None) -> AirccPreset:
    """The base preset (default: aircc's defaults) with the stack the kernels need (rounded up to STACK_STEP) and,
    unless the base sets one, the runtime loop tiling the most demanding of them needs (per launch dim the
    smallest tile size any kernel asks for: one preset serves every launch of the module)."""
    texts = list(texts)
    preset = base or AirccPreset()
    need = stack_need(texts)
    if need > preset.stack_size:
        preset = replace(preset, stack_size=-(-need // STACK_STEP) * STACK_STEP)
    if not preset.runtime_loop_tiling_sizes:
        wanted = [t for t in map(runtime_tiling, texts) if t]
        if wanted:
            preset = replace(preset, runtime_loop_tiling_sizes=tuple(min(t[i] for t in wanted)
                                                                     for i in range(max(map(len, wanted)))))
    return preset


def _has(rep, tile: str, resource: str) -> bool:
    return any(v.tile == tile and v.resource == resource for v in rep.violations)


def derive_preset(text: str, name: str | None = None, base: AirccPreset | None = None) -> AirccPreset:
    from kernel_builder.hw.module_report import analyze_module

    preset = base or AirccPreset()
    rep = analyze_module(text, name, preset=preset)
    need = rep.usage.stack_need
    if need > preset.stack_size:
        preset = replace(preset, stack_size=-(-need // STACK_STEP) * STACK_STEP)
        rep = analyze_module(text, name, preset=preset)
    if _has(rep, "core", "L1 bytes") and not preset.omit_pingpong:
        trial = replace(preset, omit_pingpong="L1")
        if not _has(analyze_module(text, name, preset=trial), "core", "L1 bytes"):
            preset = trial
    return preset
