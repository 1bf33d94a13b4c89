"""The cost model: per launch max(compute, L1 streams, shim data movement) (x the ELF factor for a launch with
matrix-unit work) + a per-launch overhead; per module the sum of its launches + one dispatch. All parameters
live in `CostParams` (one frozen dataclass) whose defaults are the *likely* values; every field carries its
source (or says "assumption") and an optimistic / pessimistic value in its metadata
(`kernel_builder.hw.scenarios` builds the three scenarios from them; docs/hardware-model.md prints the table).
`calibrate(points)` refits the `FITTED` parameters from any list of measured points (e.g. a real NPU run).

- compute of a launch = its busiest herd tile, in cycles at clock_hz: `compute_cycles(counts)` turns the tile's
  counted instructions (the host aie_api's kinds, declared per call by each kernel's descriptor and checked
  against the host aie_api by tests/test_kernel_counts.py) into cycles: each kind issues in a VLIW slot (vector,
  move, two loads, one store, scalar: UG1603 / AM020) at its per-kind cycles; the tile takes its busiest slot
  plus (1 - vliw_overlap) of the others, plus call_overhead_cycles per external call. linalg.matmul MACs
  lowered to scalar loops and scalar float ops run on the scalar slot at scalar_cycles_per_op. No efficiency
  factor is fitted: the counted GEMM / GEMV rates are outputs (`make bench` prints them beside the kernel
  registry's measurements);
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


CLOCK_HZ = 1.5e9   # clock_hz's value (CostParams below), which bfp16_mmul_cycles' measured bound is expressed at


def bfp16_mmul_cycles_bound(clock_hz: float = CLOCK_HZ, tflops: float | None = None) -> float:
    """The most issue cycles (at `clock_hz`) one block-float 8x8x8 mmul can take on an NPU2 core, from a
    measured whole-GEMM rate (default: the best on Strix, facts.py bfp16_gemm_tflops_measured): the GEMM's 32
    cores issued all of its mmuls within its measured time, whatever else it waited for, so one core's mmul
    takes at most cores x 2 x 512 / rate seconds."""
    rate = 1e12 * (tflops or max(strix for _, strix, _ in NPU2.bfp16_gemm_tflops_measured))
    return NPU2.core_tiles * 2 * math.prod(NPU2.bfp16_mmul_shape) * clock_hz / rate


@dataclass(frozen=True)
class CostParams:
    clock_hz: float = _p(CLOCK_HZ, CLOCK_HZ, CLOCK_HZ, "derived",
                         "50 TOPS int8 marketed for Strix / (32 tiles x facts.py int8_macs_per_cycle (512) x 2 ops); "
                         "the driver's turbo H-clock is higher (facts.py aie_clock_max_hz, 1.8 GHz: 59 TOPS)")
    bfp16_mmul_cycles: float = _p(1.0, 1.0, round(bfp16_mmul_cycles_bound(), 2), "derived",
                                  "issue cycles (at clock_hz) of one block-float 8x8x8 mmul (512 MACs) in the vector "
                                  "slot. Pessimistic: the bound the best measured bfp16 GEMM on Strix sets (facts.py "
                                  "bfp16_gemm_tflops_measured, ATB config 2, 31.3 TFLOPS on 32 cores): all its mmuls "
                                  "issued within its time, so one takes at most 32 x 1024 / 31.3e12 s = 1.57 cycles "
                                  "at 1.5 GHz (1.88 at the 1.8 GHz turbo H-clock), i.e. >= 326 (272) MAC/cycle/core, "
                                  "which refutes the bf16 rate (facts.py bf16_mmul_macs_per_cycle 256: 2 cycles). "
                                  "Likely and optimistic 1: one vector instruction per bundle (UG1603) at the int8 "
                                  "rate (facts.py int8_macs_per_cycle; AMD markets XDNA 2 block FP16 at 8-bit "
                                  "throughput); ATB config 2's inner loop counted with the other parameters likely "
                                  "models below its measured rate even at 1 cycle (tests/test_hw_scenarios.py)")
    f32_mul_cycles: float = _p(3.0, 2.0, 6.0, "assumption",
                               "vector-slot cycles of one f32 x f32 mul/mac of 16 lanes: emulated from bf16 "
                               "products (UG1603 'Floating-Point Operations', default --aie.float-accuracy fast: "
                               "hi/lo bf16 splits, 3 partial products); 2 (low) to 6 (safe)")
    elementary_cycles: float = _p(2.0, 1.0, 4.0, "assumption",
                                  "vector-slot cycles of one exp2 / tanh (16 lanes) or inv (32 lanes): exp2 is one "
                                  "VEXP2 instruction (UG1639), inv an initial guess + a polynomial step (aie_api "
                                  "aie2p/elementary.hpp:196); 1-4")
    reduce_cycles: float = _p(8.0, 5.0, 12.0, "assumption",
                              "cycles of one reduce_add / reduce_max of a 16-lane f32 vector: log2(16) = 4 "
                              "shuffle + add/max pairs (aie_api aie.hpp:4189, :2111), partly overlapped; 5-12")
    shuffle_vector_share: float = _p(0.5, 0.0, 1.0, "assumption",
                                     "share of shuffles / broadcasts that issue in the vector slot (the rest in "
                                     "the move slot; UG1603: one vector and one move instruction per VLIW "
                                     "bundle); which permutes the move slot takes is unpublished: 0-1")
    load_bytes_per_cycle: float = _p(64.0, 128.0, 32.0, "fact",
                                     "two 256-bit load units (AM020 'Functional Overview'; UG1603: two loads per "
                                     "VLIW); optimistic 128 if AIE-ML v2's units are 512-bit (AM027 gives no "
                                     "width), pessimistic 32 (bank conflicts serialise the two units)")
    store_bytes_per_cycle: float = _p(32.0, 64.0, 32.0, "fact",
                                      "one 256-bit store unit (AM020; UG1603: one store per VLIW); optimistic 64 "
                                      "if AIE-ML v2's is 512-bit")
    vliw_overlap: float = _p(0.5, 1.0, 0.0, "assumption",
                             "share of the non-critical slots' cycles hidden under the busiest slot (vector, "
                             "move, load, store, scalar) by the compiler's bundling: 1 = perfect packing "
                             "(software-pipelined inner loops), 0 = no two slots in one bundle; unmeasured")
    call_overhead_cycles: float = _p(60.0, 30.0, 120.0, "assumption",
                                     "per external kernel call: call/return, prologue and epilogue, set_rounding, "
                                     "loop set-up and the pipeline fill of its inner loops; unmeasured, x0.5-x2")
    scalar_cycles_per_op: float = _p(30.0, 15.0, 60.0, "assumption",
                                     "one f32 add/mul/compare on the scalar unit, which has no FPU (soft-float "
                                     "routine + loads/stores); unmeasured, x0.5-x2")
    scalar_accel_cycles: float = _p(4.0, 2.0, 10.0, "assumption",
                                    "one scalar invsqrt (AM027 'Arithmetic Logic Unit': hardware acceleration for "
                                    "inverse, sqrt and inverse sqrt; latency unpublished) or scalar bf16 conversion")
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
    launch_overhead_s: float = _p(20.55e-6, 7.48e-6, 60.37e-6, "fitted",
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

FITTED = ("launch_overhead_s",)

# ------------------------------------------------------------------------------------------ compute seam

# The kinds a tile's compute is counted in: the host aie_api's instruction kinds (kernel_builder.instr_counts,
# docs/aie-api-host.md), each in the VLIW slot it issues in with its cycles, plus the analyzer's own kinds.
ISSUE_KINDS = {
    "mmul_bfp16_8x8x8": "vector slot, bfp16_mmul_cycles",
    "mmul_bf16_4x8x8_emulated": "0: its 8 vmac_bf16, 9 shuffles and 16 broadcasts are counted as such",
    "vmac_bf16": "vector slot, 1 cycle (one bf16 vector operation per bundle, UG1603)",
    "vmul_f32_emulated": "vector slot, f32_mul_cycles",
    "vadd_acc": "vector slot, 1", "vconvert": "vector slot, 1", "bfp16_convert": "vector slot, 1",
    "vmax": "vector slot, 1", "scalar_bf16_convert": "vector slot, 1",
    "unpack": "vector slot, 1 (int4 -> int8 widening: assumed one vector operation per 512-bit result)",
    "exp2": "vector slot, elementary_cycles", "tanh": "vector slot, elementary_cycles",
    "inv": "vector slot, elementary_cycles",
    "reduce_add": "vector slot, reduce_cycles", "reduce_max": "vector slot, reduce_cycles",
    "shuffle": "shuffle_vector_share in the vector slot, the rest in the move slot",
    "broadcast": "as shuffle",
    "vload": "load slot: at most 2 per cycle", "vload_bytes": "load slot: load_bytes_per_cycle",
    "vstore": "store slot: at most 1 per cycle", "vstore_bytes": "store slot: store_bytes_per_cycle",
    "invsqrt_scalar": "scalar slot, scalar_accel_cycles",
    "calls": "external kernel calls: call_overhead_cycles each (outside the bundles)",
    "scalar_ops": "scalar float ops (soft-float): scalar_cycles_per_op, scalar slot",
    "matmul_scalar_macs": "linalg.matmul MACs lowered to scalar loops: 2 x scalar_cycles_per_op, scalar slot",
    "matmul_vector_macs": "linalg.matmul MACs a design vectorises: as block-float 8x8x8 mmuls (512 MACs each)",
}
MATRIX_KINDS = ("mmul_bfp16_8x8x8", "mmul_bf16_4x8x8_emulated", "matmul_vector_macs")
_ONE_CYCLE = ("vmac_bf16", "vadd_acc", "vconvert", "bfp16_convert", "vmax", "scalar_bf16_convert", "unpack")


def slot_cycles(counts: dict, params: CostParams = PARAMS) -> dict[str, float]:
    """Cycles each VLIW slot is busy for these counts (UG1603: per bundle two loads, one store, one scalar,
    one vector and one move instruction)."""
    p, c = params, counts.get
    unknown = set(counts) - set(ISSUE_KINDS)
    if unknown:
        raise ValueError(f"compute_cycles: unknown kind(s) {sorted(unknown)}; known: {sorted(ISSUE_KINDS)}")
    permutes = c("shuffle", 0) + c("broadcast", 0)
    vector = (sum(c(k, 0) for k in _ONE_CYCLE)
              + (c("mmul_bfp16_8x8x8", 0) + c("matmul_vector_macs", 0) / 512) * p.bfp16_mmul_cycles
              + c("vmul_f32_emulated", 0) * p.f32_mul_cycles
              + (c("exp2", 0) + c("tanh", 0) + c("inv", 0)) * p.elementary_cycles
              + (c("reduce_add", 0) + c("reduce_max", 0)) * p.reduce_cycles
              + permutes * p.shuffle_vector_share)
    return {"vector": vector,
            "move": permutes * (1 - p.shuffle_vector_share),
            "load": max(c("vload", 0) / 2, c("vload_bytes", 0) / p.load_bytes_per_cycle),
            "store": max(c("vstore", 0), c("vstore_bytes", 0) / p.store_bytes_per_cycle),
            "scalar": (c("invsqrt_scalar", 0) * p.scalar_accel_cycles
                       + (c("scalar_ops", 0) + 2 * c("matmul_scalar_macs", 0)) * p.scalar_cycles_per_op)}


def compute_cycles(counts: dict, params: CostParams = PARAMS) -> float:
    """Cycles of one tile's work from its instruction counts by kind (ISSUE_KINDS; an unknown kind is an error):
    the busiest VLIW slot, plus (1 - vliw_overlap) of the other slots' cycles, plus the call overheads."""
    slots = slot_cycles(counts, params)
    busiest, total = max(slots.values()), sum(slots.values())
    calls = counts.get("calls", 0) * params.call_overhead_cycles
    return busiest + (1 - params.vliw_overlap) * (total - busiest) + calls


def work_counts(work, vectorized_matmul: bool = False) -> dict:
    """The counts of a launch's busiest tile: the analyzer's Work (`tile_counts`: the external kernels'
    counted instructions, kernel_builder/<kind>/external.py) plus its linalg and scalar work."""
    mm = work.tile_matmul_macs
    out = dict(getattr(work, "tile_counts", {}) or {})
    for k, v in (("matmul_vector_macs", mm if vectorized_matmul else 0),
                 ("matmul_scalar_macs", 0 if vectorized_matmul else mm), ("scalar_ops", work.tile_scalar_ops)):
        if v:
            out[k] = out.get(k, 0) + v
    return out


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
    fields (tile_counts, tile_matmul_macs, tile_scalar_ops, flows; optionally tile_l1_in_bytes,
    tile_l1_out_bytes). `counts` (by ISSUE_KINDS)
    replaces the Work's compute counts, e.g. counted from a kernel run. `elf`: the module is a (multi-launch)
    ELF, whose launches with matrix-unit work cost elf_gemm_factor x (the registry's xclbins: elf=False)."""
    p = params
    counts = work_counts(work, vectorized_matmul) if counts is None else counts
    compute = compute_cycles(counts, p) / p.clock_hz
    l1 = max(getattr(work, "tile_l1_in_bytes", 0), getattr(work, "tile_l1_out_bytes", 0)) / p.l2_l1_bytes_per_s
    dma = max(shim_seconds(work.flows, p), l1)
    matrix = any(counts.get(k, 0) for k in MATRIX_KINDS)
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
PRIOR = CostParams(launch_overhead_s=50e-6)
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
