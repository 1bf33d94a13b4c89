"""The cost model: per launch max(compute, data movement) + a per-launch overhead; per module the sum of its
launches + one dispatch. All parameters live in `CostParams` (one frozen dataclass); `PARAMS` holds the
values calibrated on the reference design's published Strix figures (benchmarks/hw_calibration.py), and
`calibrate(points)` refits them from any list of measured points (e.g. a real NPU run).

- compute of a launch = its busiest herd tile: external kernels' vector cycles / vector_efficiency
  + their matrix-unit MACs (aie::mmul) at the bf16 mmul rate x gemm_efficiency
  + linalg.matmul MACs (scalar loops: scalar_cycles_per_op per multiply and per add; or, for a design that
  vectorises them, at the bf16 mmul rate x gemm_efficiency) + scalar float ops x scalar_cycles_per_op;
- data movement = the busiest shim channel (bytes / shim_channel_bytes_per_s + DMA tasks x shim_task_s),
  and at least all shim bytes / ddr_bytes_per_s;
- dispatch = dispatch_overhead_s per module (one xrt.run).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace
from typing import Iterable

from kernel_builder.hw.facts import NPU2


@dataclass(frozen=True)
class CostParams:
    clock_hz: float = 1.5e9                     # derived: 50 TOPS int8 / (32 tiles x 512 int8 MACs x 2 ops)
    mmul_macs_per_cycle: int = NPU2.bf16_mmul_macs_per_cycle
    gemm_efficiency: float = 0.30               # calibrated: share of the mmul peak a vectorised GEMM sustains
    vector_efficiency: float = 0.5              # calibrated: share of full issue vector kernels sustain
    scalar_cycles_per_op: float = 30.0          # assumption, unmeasured: one f32 add/mul/compare on the scalar
                                                # unit, which has no FPU (soft-float routine + loads/stores)
    softmax_cycles_per_score: float = 4.0       # calibrated: online-softmax bookkeeping per (query, key) score
    shim_channel_bytes_per_s: float = 12e9      # one 64-bit stream per cycle at clock_hz (UG1603: AIE-ML v2
                                                # stream switch is 64-bit)
    ddr_bytes_per_s: float = 50e9               # calibrated: all shim channels together
    shim_task_s: float = 0.5e-6                 # per DMA task the runtime issues (BD write + queue push)
    launch_overhead_s: float = 50e-6            # calibrated: per air.launch (array reconfiguration)
    dispatch_overhead_s: float = NPU2.dispatch_overhead_s


# Calibrated on the reference design's published figures and the kernel registry's measurements
# (benchmarks.hw_calibration.all_points());
# regenerate with `python -m benchmarks.hw_calibration` (docs/hardware-model.md, "Calibration").
PARAMS = CostParams(gemm_efficiency=1.0, vector_efficiency=0.08712, softmax_cycles_per_score=6.039,
                    shim_channel_bytes_per_s=4.227e9, ddr_bytes_per_s=77.92e9, launch_overhead_s=17.91e-6)

FITTED = ("gemm_efficiency", "vector_efficiency", "softmax_cycles_per_score", "shim_channel_bytes_per_s",
          "ddr_bytes_per_s", "launch_overhead_s")


@dataclass(frozen=True)
class LaunchCost:
    compute_s: float
    dma_s: float
    overhead_s: float

    @property
    def total_s(self) -> float:
        return max(self.compute_s, self.dma_s) + self.overhead_s

    @property
    def bound(self) -> str:
        return "compute" if self.compute_s >= self.dma_s else "DMA"


def launch_cost(work, params: CostParams = PARAMS, vectorized_matmul: bool = False) -> LaunchCost:
    """Cost of one launch from its analyzer Work (kernel_builder.hw.analyze.Work) or any object with the same
    fields (tile_vector_cycles, tile_matmul_macs, tile_scalar_ops, flows)."""
    p = params
    if vectorized_matmul:
        mm_cycles = work.tile_matmul_macs / (p.mmul_macs_per_cycle * p.gemm_efficiency)
    else:
        mm_cycles = work.tile_matmul_macs * 2 * p.scalar_cycles_per_op
    mm_cycles += getattr(work, "tile_mmul_macs", 0) / (p.mmul_macs_per_cycle * p.gemm_efficiency)
    cycles = (work.tile_vector_cycles / p.vector_efficiency + mm_cycles + work.tile_scalar_ops * p.scalar_cycles_per_op
              + getattr(work, "tile_scores", 0) * p.softmax_cycles_per_score)
    compute = cycles / p.clock_hz
    busiest = max((f.bytes / p.shim_channel_bytes_per_s + f.tasks * p.shim_task_s for f in work.flows), default=0.0)
    total_bytes = sum(f.bytes for f in work.flows)
    dma = max(busiest, total_bytes / p.ddr_bytes_per_s)
    return LaunchCost(compute, dma, p.launch_overhead_s)


def module_seconds(works: Iterable, params: CostParams = PARAMS, vectorized_matmul: bool = False) -> float:
    return sum(launch_cost(w, params, vectorized_matmul).total_s for w in works) + params.dispatch_overhead_s


# ------------------------------------------------------------------------------------------ calibration

@dataclass(frozen=True)
class Point:
    """One measured module: its launches' Work and the measured seconds."""
    name: str
    works: tuple
    measured_s: float
    vectorized_matmul: bool = True
    source: str = ""


def errors(points: Iterable[Point], params: CostParams = PARAMS) -> list[tuple[str, float, float, float]]:
    """[(name, modeled s, measured s, relative error)]."""
    out = []
    for pt in points:
        m = module_seconds(pt.works, params, pt.vectorized_matmul)
        out.append((pt.name, m, pt.measured_s, m / pt.measured_s - 1.0))
    return out


PRIOR = CostParams()   # the physical defaults the fit is pulled towards (weight PRIOR_WEIGHT)
PRIOR_WEIGHT = 0.01


def _loss(points, params, names: tuple[str, ...] = ()) -> float:
    """Squared log error over the points, plus a weak pull of each fitted parameter towards its prior value:
    a parameter no point constrains (e.g. GEMM efficiency while every GEMM point is DMA-bound) stays at its
    physical default instead of drifting."""
    fit = sum(math.log(m / s) ** 2 for _, m, s, _ in errors(points, params))
    prior = sum(math.log(getattr(params, n) / getattr(PRIOR, n)) ** 2 for n in names)
    return fit + PRIOR_WEIGHT * prior


def calibrate(points: list[Point], start: CostParams = PARAMS, names: tuple[str, ...] = FITTED,
              iterations: int = 600) -> CostParams:
    """Fit `names` to minimise the squared log error over the points: Nelder-Mead on the logarithms of the
    parameters, restarted from the start point and from each parameter scaled by 1/8 and 8 (the loss has
    kinks where a launch turns from compute- to DMA-bound); deterministic, no dependency. Efficiencies are
    capped at 1."""
    best = _nelder_mead(points, start, names, iterations)
    for name in names:
        for factor in (1 / 8, 8):
            p = _nelder_mead(points, replace(start, **{name: getattr(start, name) * factor}), names, iterations)
            if _loss(points, p, names) < _loss(points, best, names) - 1e-12:
                best = p
    return _nelder_mead(points, best, names, iterations)


def _nelder_mead(points, start: CostParams, names, iterations) -> CostParams:
    def make(x) -> CostParams:
        kw = {}
        for n, v in zip(names, x):
            v = math.exp(v)
            kw[n] = min(v, 1.0) if n.endswith("efficiency") else v
        return replace(start, **kw)

    def f(x) -> float:
        return _loss(points, make(x), names)

    x0 = [math.log(getattr(start, n)) for n in names]
    simplex = [x0] + [[v + (0.7 if i == j else 0.0) for j, v in enumerate(x0)] for i in range(len(x0))]
    vals = [f(x) for x in simplex]
    for _ in range(iterations):
        order = sorted(range(len(simplex)), key=vals.__getitem__)
        simplex, vals = [simplex[i] for i in order], [vals[i] for i in order]
        if vals[-1] - vals[0] < 1e-10:
            break
        centroid = [sum(x[j] for x in simplex[:-1]) / (len(simplex) - 1) for j in range(len(x0))]
        worst = simplex[-1]
        refl = [c + (c - w) for c, w in zip(centroid, worst)]
        fr = f(refl)
        if fr < vals[0]:
            exp_ = [c + 2 * (c - w) for c, w in zip(centroid, worst)]
            fe = f(exp_)
            simplex[-1], vals[-1] = (exp_, fe) if fe < fr else (refl, fr)
        elif fr < vals[-2]:
            simplex[-1], vals[-1] = refl, fr
        else:
            con = [c + 0.5 * (w - c) for c, w in zip(centroid, worst)]
            fc = f(con)
            if fc < vals[-1]:
                simplex[-1], vals[-1] = con, fc
            else:
                best = simplex[0]
                simplex = [best] + [[b + 0.5 * (x - b) for b, x in zip(best, s)] for s in simplex[1:]]
                vals = [vals[0]] + [f(x) for x in simplex[1:]]
    return make(simplex[min(range(len(simplex)), key=vals.__getitem__)])


def describe(params: CostParams = PARAMS) -> list[tuple[str, object]]:
    return [(f.name, getattr(params, f.name)) for f in fields(params)]
