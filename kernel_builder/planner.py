"""What the kernels' tiling plans (kernel_builder/<kind>/plan.py) share: the NPU2 limits they plan against (read
from the one facts table, kernel_builder.hw.facts), the L1/L2 budgets, the row plan of the elementwise kernels
and the search helpers.

A plan is the small set of integers a builder needs (tile sizes, herd shape, chunking). Every `plan_<kind>`
either returns a plan that fits the hardware limits below or raises `ValueError` naming the kernel, the
dimension and the limit, so an untileable model shape fails at build time, not on the device.
"""
from __future__ import annotations

from dataclasses import dataclass

from kernel_builder.hw.facts import NPU2

KiB = 1024

# --- NPU2 / AIE2P limits (kernel_builder.hw.facts) ------------------------------------------------------
NPU2_COLS = NPU2.columns      # compute-tile columns of the NPU2 array (herd x extent)
NPU2_ROWS = NPU2.core_rows    # compute-tile rows per column (herd y extent)
L1_BYTES = NPU2.core_memory_bytes  # data memory of one compute tile
L1_STACK_RESERVE = 4 * KiB    # core stack + kernel scratch kept out of the data budget
L1_BUDGET = L1_BYTES - L1_STACK_RESERVE  # what one tile's buffers (incl. double buffers) may use
MEMTILE_BYTES = NPU2.memtile_bytes  # one memory tile (L2); an L2 buffer must fit in one
N_MEMTILES = NPU2.memtiles    # memory tiles of the NPU2 array (one per column)
L2_BUDGET = N_MEMTILES * MEMTILE_BYTES
MMUL_M, MMUL_K, MMUL_N = NPU2.bfp16_mmul_shape  # the GEMM's matmul step (8x8x8): its tiles are multiples of it
BF16 = 2                      # bytes per element
F32 = 4
MAX_ELEMWISE_CHUNK = 4096     # elements per elementwise L1 chunk: beyond this DMA overhead is already amortised
MIN_ELEMWISE_CHUNK = 256      # below this a chunk's DMA setup dominates; spread over fewer tiles instead


def kib(nbytes: int) -> str:
    return f"{nbytes / KiB:.3g} KiB"


def check_positive(kernel: str, **dims) -> None:
    for name, value in dims.items():
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise ValueError(f"{kernel}: {name} must be a positive int, got {value!r}")


def divisors_desc(n: int, cap: int) -> list[int]:
    return [d for d in range(min(n, cap), 0, -1) if n % d == 0]


def widest_herd(n_units: int, cap: int = NPU2_COLS) -> int:
    """Largest herd extent <= cap that divides the number of work units evenly."""
    return divisors_desc(n_units, cap)[0]


# --- plans ---------------------------------------------------------------------------------------------
def pingpong_copies(steps: int) -> int:
    """L1 copies of a buffer allocated in a loop of `steps` trips and filled by a DMA first: aircc's ping-pong
    transform (air-label-scf-for-to-ping-pong + air-ping-pong-transform) doubles it when the loop runs at least
    twice. Our builders allocate only DMA-filled buffers inside loops; buffers an external call writes (outputs,
    accumulators) are allocated once at the top of the herd, so the transform applies wherever `steps >= 2`."""
    return 2 if steps >= 2 else 1


def even_or_one(steps: int) -> bool:
    """Ping-ponged loops get an even trip count: mlir-air before PR #2000 (2026-09) unrolled odd trip counts
    into a third buffer whose DMA could send unwritten data (mlir-air PR #2000)."""
    return steps == 1 or steps % 2 == 0


@dataclass(frozen=True)
class RowPlan:
    """Elementwise and RMSNorm kernels over the data flattened to 1-D: herd [herd, 1], tile t owns the
    contiguous range [t*units_per_tile, (t+1)*units_per_tile) of units and moves `chunk` units per step
    (offsets affine in the tile id and the loop iv). `unit` is what they count: 'elements' (add, swiglu) or
    'groups' of `group` elements (rmsnorm: a row, or one head of a row for the per-head q/k norm).
    `streams` DMA-filled inputs per step (ping-ponged when the loop runs twice or more) and one output buffer
    (allocated once: the external call writes it first)."""

    herd: int
    units_per_tile: int
    chunk: int
    unit: str
    group: int = 1        # elements per unit
    inputs: tuple[tuple[str, int], ...] = ()   # (name, elements per step) of the DMA-filled buffers

    @property
    def steps(self) -> int:
        return self.units_per_tile // self.chunk

    @property
    def chunk_elements(self) -> int:
        return self.chunk * self.group

    def l1_buffers(self) -> dict[str, int]:
        c = pingpong_copies(self.steps)
        out = {name: c * BF16 * n for name, n in self.inputs}
        out["y"] = BF16 * self.chunk_elements
        return out

    def l1_bytes(self) -> int:
        return sum(self.l1_buffers().values())


def flat_plan(kernel: str, n_units: int, group: int, inputs: tuple[tuple[str, int], ...], multiple: int,
               max_chunk: int, unit: str) -> RowPlan | None:
    """The best RowPlan over n_units units of `group` elements; `inputs` = (name, elements per unit) of the
    DMA-filled input buffers. Chunks hold a multiple of `multiple` elements (vector width)."""
    best, best_key = None, None
    for herd in divisors_desc(n_units, NPU2_COLS):
        per = n_units // herd
        for chunk in divisors_desc(per, max(1, max_chunk // group)):
            elems = chunk * group
            if elems % multiple:
                continue
            plan = RowPlan(herd, per, chunk, unit, group, tuple((nm, chunk * e) for nm, e in inputs))
            if plan.l1_bytes() > L1_BUDGET:
                continue
            # prefer: a safe ping-pong trip count, chunks that amortise a DMA, then the widest herd, then the
            # biggest chunk
            key = (even_or_one(plan.steps), elems >= min(MIN_ELEMWISE_CHUNK, group * n_units), herd, elems)
            if best_key is None or key > best_key:
                best, best_key = plan, key
    return best


def plan_elementwise(kernel: str, rows: int, dim: int, inputs: tuple[str, ...], multiple: int) -> RowPlan:
    check_positive(kernel, rows=rows, dim=dim)
    plan = flat_plan(kernel, rows * dim, 1, tuple((nm, 1) for nm in inputs), multiple, MAX_ELEMWISE_CHUNK,
                      "elements")
    if plan is None:
        raise ValueError(f"{kernel}: dim={dim} x rows={rows} has no chunk that is a multiple of {multiple} "
                         f"(vector width) and at most {MAX_ELEMWISE_CHUNK} elements with "
                         f"{len(inputs)} double-buffered inputs and one output in {kib(L1_BUDGET)} of L1")
    return plan


