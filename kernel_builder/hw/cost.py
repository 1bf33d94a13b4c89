"""The cost model: per launch max(compute, L1 streams, shim data movement) (x the ELF factor for a launch with
matrix-unit work) + a per-launch overhead; per module the sum of its launches + one dispatch. All parameters
live in `CostParams` (one frozen dataclass) whose defaults are the *likely* values; every field carries its
source (or says "assumption") and an optimistic / pessimistic value in its metadata
(`kernel_builder.hw.scenarios` builds the three scenarios from them; docs/hardware-model.md prints the table).
`calibrate(points)` refits the `FITTED` parameters from any list of measured points (e.g. a real NPU run).

- compute of a launch = its busiest herd tile, in cycles at clock_hz: `compute_cycles(counts)` - the seam where
  per-kind instruction counts meet per-kind issue rates (`ISSUE_KINDS`); today the counts are the external
  kernels' descriptors (kernel_builder.external_costs) via `work_counts(work)`, a counted kernel run can pass
  its own counts instead:
  block-float mmul MACs at the bf16 mmul rate x gemm_efficiency, emulated bf16 mmul MACs (a kernel compiled
  without aie_api's block-float flag) at mmul_emulated_macs_per_cycle, vector cycles / vector_efficiency,
  linalg.matmul MACs (scalar loops: scalar_cycles_per_op per multiply and per add; or, for a design that
  vectorises them, at the bf16 mmul rate x gemm_efficiency), scalar float ops x scalar_cycles_per_op, attention
  scores x softmax_cycles_per_score;
- L1 streams = the busiest tile's busiest L2 -> L1 (or L1 -> L2) stream bytes / l2_l1_bytes_per_s;
- shim data movement = the busiest shim column per direction (each channel: bytes / shim_channel_bytes_per_s +
  DMA tasks x shim_task_s; a column's second channel adds second_channel_gain of one channel's rate), and at
  least all shim bytes / ddr_bytes_per_s;
- a launch with matrix-unit work in a module built as an ELF (every module of ours and of the reference design;
  not the kernel registry's single-kernel xclbins) costs elf_gemm_factor x that;
- dispatch = dispatch_overhead_s per module (one xrt.run).
Host time (Python, buffer writes) is not part of a module: benchmarks add the measured host time per pass.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, replace
from typing import Iterable

from kernel_builder.hw.facts import NPU2

REG = "mlir-air programming_examples/kernel_registry"
SMOLVLA = "mlir-air programming_examples/llms/smolvla/docs/profile.md"
FUSED_DECODE = "mlir-air programming_examples/fused_decode/README.md"
KINDS = ("fact", "derived", "measured", "fitted", "assumption")


def _p(likely, optimistic, pessimistic, kind: str, source: str):
    """A cost parameter: its likely value (the default), the optimistic and pessimistic ends of its range, what
    kind of figure it is (KINDS) and its source (for an assumption: why the range)."""
    return field(default=likely, metadata={"kind": kind, "source": source, "optimistic": optimistic,
                                           "pessimistic": pessimistic})


@dataclass(frozen=True)
class CostParams:
    clock_hz: float = _p(1.5e9, 1.5e9, 1.5e9, "derived",
                         "50 TOPS int8 marketed for Strix / (32 tiles x 512 int8 MACs x 2 ops)")
    mmul_macs_per_cycle: int = _p(NPU2.bf16_mmul_macs_per_cycle, NPU2.bf16_mmul_macs_per_cycle,
                                  NPU2.bf16_mmul_macs_per_cycle, "fact", "facts.py bf16_mmul_macs_per_cycle")
    gemm_efficiency: float = _p(8508 / 24576, 9797 / 24576, 7342 / 24576, "measured",
                                f"{REG} details/GEMM_bf16_in_fp32_out.md, external path, 8x4 herd, shapes "
                                "2048x2048x{512,2048,8192} and 2048x8192x2048: 7342-9797 GFLOPS (likely 8508, "
                                "2048^3) of the 24576 GFLOPS mmul peak (32 tiles x 256 MAC x 2 x 1.5 GHz); "
                                "described there as compute-bound")
    mmul_emulated_macs_per_cycle: float = _p(16.0, 30.0, 8.0, "assumption",
                                             "bf16 aie::mmul<4,8,8> without -DAIE_API_EMULATE_BFLOAT16_MMUL_WITH_BFP16"
                                             ": aie_api's aie2p emulated_mmul_intrinsics.hpp mac_4x8_8x8_bf16 builds "
                                             "each 256-MAC step from 8 mac_elem_32 plus 25 shuffles/broadcasts: "
                                             "256 MACs per 8 (macs alone issue) to 33 (all serial) cycles")
    vector_efficiency: float = _p(0.08859, 0.08859, 0.08808, "fitted",
                                  "fitted on all calibration points (benchmarks/hw_calibration.py); range: the fit "
                                  "on the registry alone (the reference modules alone leave it at its prior)")
    scalar_cycles_per_op: float = _p(30.0, 15.0, 60.0, "assumption",
                                     "one f32 add/mul/compare on the scalar unit, which has no FPU (soft-float "
                                     "routine + loads/stores); unmeasured, x0.5-x2")
    softmax_cycles_per_score: float = _p(4.196, 4.148, 4.231, "fitted",
                                         "fitted on all points (the flash-attention points set it); range: the fits "
                                         "on the registry alone and on the reference modules alone")
    shim_channel_bytes_per_s: float = _p(31.5e9 / 8, 32.6e9 / 8, 30.6e9 / 8, "measured",
                                         f"{REG} details/GEMV_bf16.md: 8-stream GEMVs (herd 8, one weight stream "
                                         "per column) read 30.6-32.6 GB/s (likely 31.5, 8192x2048), / 8 channels")
    second_channel_gain: float = _p(0.13, 0.33, 0.0, "measured",
                                    f"{FUSED_DECODE}: the 1B decode design with the weights on both MM2S channels "
                                    "of a column runs 1.13x the single-channel rate (a design not bound by its "
                                    "weights: none); eltwise add 8M (details/EltwiseAdd_bf16.md, 63 GB/s, 2 reads "
                                    "per column) reads 1.33x the one-channel rate per column")
    ddr_bytes_per_s: float = _p(57.7e9, 63.0e9, 50e9, "measured",
                                f"{REG} details/EltwiseAdd_bf16.md: 57.7 GB/s (2048x2048, herd 8x1), 63.0 GB/s at "
                                "8M elements, the best NPU2 figures; pessimistic 50 GB/s is an assumption (host "
                                "DDR traffic alongside)")
    l2_l1_bytes_per_s: float = _p(6e9, 12e9, 4.5e9, "assumption",
                                  "one core DMA stream (L2 -> L1 or L1 -> L2): 32-bit stream port per cycle at "
                                  "clock_hz (AM020 AIE-ML stream switch); optimistic 64-bit, pessimistic 75% "
                                  "(lock / BD turnarounds)")
    shim_task_s: float = _p(0.5e-6, 0.25e-6, 1e-6, "assumption",
                            "per DMA task the runtime issues (BD write + queue push); unmeasured, x0.5-x2")
    launch_overhead_s: float = _p(12.39e-6, 4.85e-6, 59.68e-6, "fitted",
                                  "fitted on all points (per air.launch: array reconfiguration); range: the fits on "
                                  "the registry alone and on the reference modules alone")
    elf_gemm_factor: float = _p(1.35, 1.26, 1.94, "measured",
                                f"{SMOLVLA} section 5: the same GEMM module lowered to a multi-launch ELF runs "
                                "1.26-1.42x (format alone) and 1.35-1.94x (in situ) the time of its xclbin, on "
                                "which every kernel-registry figure was measured")
    dispatch_overhead_s: float = _p(NPU2.dispatch_overhead_s, 70e-6, 130e-6, "measured",
                                    "facts.py dispatch_overhead_s (guide B5: ~100 us per xrt.run); range +-30% "
                                    "is an assumption")


# The likely values; kernel_builder.hw.scenarios gives the optimistic and pessimistic ones. The FITTED values
# come from `python -m benchmarks.hw_calibration` (docs/hardware-model.md, "Calibration").
PARAMS = CostParams()

FITTED = ("vector_efficiency", "softmax_cycles_per_score", "launch_overhead_s")

# ------------------------------------------------------------------------------------------ compute seam

# The kinds of work a tile's compute is counted in, each with the CostParams rate it is charged at. A counted
# kernel run (instructions by kind) maps its counts onto these, or adds a kind here with its rate.
ISSUE_KINDS = {
    "mmul_bfp16_macs": "block-float 8x8x8 bf16 mmul MACs: mmul_macs_per_cycle x gemm_efficiency",
    "mmul_emulated_macs": "bf16 mmul MACs without the block-float flag: mmul_emulated_macs_per_cycle",
    "vector_cycles": "vector instructions at full issue: / vector_efficiency",
    "matmul_vector_macs": "linalg.matmul MACs a design vectorises: as mmul_bfp16_macs",
    "matmul_scalar_macs": "linalg.matmul MACs lowered to scalar loops: 2 x scalar_cycles_per_op",
    "scalar_ops": "scalar float ops: scalar_cycles_per_op",
    "scores": "online-softmax bookkeeping per attention score: softmax_cycles_per_score",
}


def compute_cycles(counts: dict, params: CostParams = PARAMS) -> float:
    """Cycles of one tile's work from counts by kind (ISSUE_KINDS; an unknown kind is an error)."""
    p = params
    unknown = set(counts) - set(ISSUE_KINDS)
    if unknown:
        raise ValueError(f"compute_cycles: unknown kind(s) {sorted(unknown)}; known: {sorted(ISSUE_KINDS)}")
    c = counts.get
    mmul_rate = p.mmul_macs_per_cycle * p.gemm_efficiency
    return ((c("mmul_bfp16_macs", 0) + c("matmul_vector_macs", 0)) / mmul_rate
            + c("mmul_emulated_macs", 0) / p.mmul_emulated_macs_per_cycle
            + c("vector_cycles", 0) / p.vector_efficiency
            + c("matmul_scalar_macs", 0) * 2 * p.scalar_cycles_per_op
            + c("scalar_ops", 0) * p.scalar_cycles_per_op
            + c("scores", 0) * p.softmax_cycles_per_score)


def work_counts(work, vectorized_matmul: bool = False) -> dict:
    """The fallback counts of a launch's busiest tile: the analyzer's Work (from the external kernels'
    hand-written descriptors) by kind."""
    mm = work.tile_matmul_macs
    return {"mmul_bfp16_macs": getattr(work, "tile_mmul_macs", 0),
            "mmul_emulated_macs": getattr(work, "tile_mmul_emulated_macs", 0),
            "vector_cycles": work.tile_vector_cycles,
            "matmul_vector_macs": mm if vectorized_matmul else 0,
            "matmul_scalar_macs": 0 if vectorized_matmul else mm,
            "scalar_ops": work.tile_scalar_ops,
            "scores": getattr(work, "tile_scores", 0)}


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


def launch_cost(work, params: CostParams = PARAMS, vectorized_matmul: bool = False, elf: bool = True,
                counts: dict | None = None) -> LaunchCost:
    """Cost of one launch from its analyzer Work (kernel_builder.hw.analyze.Work) or any object with the same
    fields (tile_vector_cycles, tile_matmul_macs, tile_scalar_ops, flows; optionally tile_mmul_macs,
    tile_mmul_emulated_macs, tile_scores, tile_l1_in_bytes, tile_l1_out_bytes). `counts` (by ISSUE_KINDS)
    replaces the Work's compute counts, e.g. counted from a kernel run. `elf`: the module is a (multi-launch)
    ELF, whose launches with matrix-unit work cost elf_gemm_factor x (the registry's xclbins: elf=False)."""
    p = params
    counts = work_counts(work, vectorized_matmul) if counts is None else counts
    compute = compute_cycles(counts, p) / p.clock_hz
    l1 = max(getattr(work, "tile_l1_in_bytes", 0), getattr(work, "tile_l1_out_bytes", 0)) / p.l2_l1_bytes_per_s
    dma = max(shim_seconds(work.flows, p), l1)
    matrix = any(counts.get(k, 0) for k in ("mmul_bfp16_macs", "mmul_emulated_macs", "matmul_vector_macs"))
    factor = p.elf_gemm_factor if elf and matrix else 1.0
    return LaunchCost(compute * factor, dma * factor, p.launch_overhead_s)


def shim_seconds(flows, params: CostParams = PARAMS) -> float:
    """The shim side of a launch: per column and direction, each channel at shim_channel_bytes_per_s (+ its DMA
    tasks), the column's channels together at (1 + second_channel_gain) x one channel's rate; the busiest
    column; and at least all bytes over ddr_bytes_per_s. A flow of unknown column (-1) has a column of its own."""
    p = params
    groups: dict = {}
    for i, f in enumerate(flows):
        groups.setdefault((f.direction, f.column if f.column >= 0 else f"own{i}"), []).append(f)
    busiest = 0.0
    for fl in groups.values():
        one = max(f.bytes / p.shim_channel_bytes_per_s + f.tasks * p.shim_task_s for f in fl)
        pair = (sum(f.bytes for f in fl) / (p.shim_channel_bytes_per_s * (1 + p.second_channel_gain * (len(fl) > 1)))
                + max(f.tasks for f in fl) * p.shim_task_s)
        busiest = max(busiest, one, pair)
    return max(busiest, sum(f.bytes for f in flows) / p.ddr_bytes_per_s)


def module_seconds(works: Iterable, params: CostParams = PARAMS, vectorized_matmul: bool = False,
                   elf: bool = True) -> float:
    return sum(launch_cost(w, params, vectorized_matmul, elf).total_s for w in works) + params.dispatch_overhead_s


# ------------------------------------------------------------------------------------------ calibration

@dataclass(frozen=True)
class Point:
    """One measured module: its launches' Work and the measured seconds."""
    name: str
    works: tuple
    measured_s: float
    vectorized_matmul: bool = True
    source: str = ""
    elf: bool = True          # a module lowered to an ELF (False: a single-kernel xclbin, as the registry's)


def errors(points: Iterable[Point], params: CostParams = PARAMS) -> list[tuple[str, float, float, float]]:
    """[(name, modeled s, measured s, relative error)]."""
    out = []
    for pt in points:
        m = module_seconds(pt.works, params, pt.vectorized_matmul, pt.elf)
        out.append((pt.name, m, pt.measured_s, m / pt.measured_s - 1.0))
    return out


# the physical defaults the fit is pulled towards (weight PRIOR_WEIGHT)
PRIOR = CostParams(vector_efficiency=0.5, softmax_cycles_per_score=4.0, launch_overhead_s=50e-6)
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
