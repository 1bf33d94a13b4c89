"""NPU2 (AIE2P) limits and the tiling plans of every kernel.

A plan is the small set of integers a builder needs (tile sizes, herd shape, chunking). Every `plan_<kind>`
either returns a plan that fits the hardware limits below or raises `ValueError` naming the kernel, the
dimension and the limit, so an untileable model shape fails at build time, not on the device.
"""
from __future__ import annotations

from dataclasses import dataclass

KiB = 1024

# --- NPU2 / AIE2P limits -------------------------------------------------------------------------------
NPU2_COLS = 8                 # compute-tile columns of the NPU2 array (herd x extent)
NPU2_ROWS = 4                 # compute-tile rows per column (herd y extent)
L1_BYTES = 64 * KiB           # data memory of one compute tile
L1_STACK_RESERVE = 4 * KiB    # core stack + kernel scratch kept out of the data budget
L1_BUDGET = L1_BYTES - L1_STACK_RESERVE  # what one tile's buffers (incl. double buffers) may use
MEMTILE_BYTES = 512 * KiB     # one memory tile (L2); an L2 buffer must fit in one
N_MEMTILES = 8                # memory tiles of the NPU2 array (one per column)
L2_BUDGET = N_MEMTILES * MEMTILE_BYTES
MMUL_M = MMUL_K = MMUL_N = 8  # AIE2P bf16 matmul intrinsic shape (8x8x8): GEMM tiles are multiples of it
VECTOR_LANES_BF16 = 32        # AIE2P vector register: 512 bit = 32 bf16 lanes (elementwise chunk granularity)
BF16 = 2                      # bytes per element
F32 = 4
MAX_GEMV_TILE_M = 16          # rows per GEMV step (bigger steps amortise the per-step DMA/lock overhead)
GEMV_MAX_TILES = 2 * NPU2_COLS  # GEMV tiles streaming weights at once: one shim MM2S channel each, 2 per column
                              # (mlir-aie AIETargetModel.cpp getNumSourceShimMuxConnections(shim, DMA) = 2)
CORE_TASK_MAX_REPEATS = 256   # runs of one core DMA task (its BD chain): aie-rt XAie_DmaChannelSetStartQueue checks
                              # RepeatCount <= MaxRepeatCount = 256 (driver/src/global/xaie2pgbl_reginit.c); the
                              # lowering gives a ping-ponged GEMV weight get one task of steps/2 runs of 2 BDs
LM_HEAD_ROW_QUANTUM = 64      # LM-head partitions are multiples of a full herd of 8-row tiles
MAX_ELEMWISE_CHUNK = 4096     # elements per elementwise L1 chunk: beyond this DMA overhead is already amortised
MIN_ELEMWISE_CHUNK = 256      # below this a chunk's DMA setup dominates; spread over fewer tiles instead

# External C++ vector-path granularity (must agree with kernel_builder.externals).
GEMV_K_MULTIPLE = 32
ROPE_HEAD_DIM_MULTIPLE = 32
SWIGLU_N_MULTIPLE = 32
ADD_N_MULTIPLE = 32
RMSNORM_GROUP_MULTIPLE = 32
ATTN_HEAD_DIM_MULTIPLE = 32


def _kib(nbytes: int) -> str:
    return f"{nbytes / KiB:.3g} KiB"


def check_positive(kernel: str, **dims) -> None:
    for name, value in dims.items():
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise ValueError(f"{kernel}: {name} must be a positive int, got {value!r}")


def _divisors_desc(n: int, cap: int) -> list[int]:
    return [d for d in range(min(n, cap), 0, -1) if n % d == 0]


def _herd(n_units: int, cap: int = NPU2_COLS) -> int:
    """Largest herd extent <= cap that divides the number of work units evenly."""
    return _divisors_desc(n_units, cap)[0]


# --- plans ---------------------------------------------------------------------------------------------
def _copies(steps: int) -> int:
    """L1 copies of a buffer allocated in a loop of `steps` trips and filled by a DMA first: aircc's ping-pong
    transform (air-label-scf-for-to-ping-pong + air-ping-pong-transform) doubles it when the loop runs at least
    twice. Our builders allocate only DMA-filled buffers inside loops; buffers an external call writes (outputs,
    accumulators) are allocated once at the top of the herd, so the transform applies wherever `steps >= 2`."""
    return 2 if steps >= 2 else 1


def _even_or_one(steps: int) -> bool:
    """Ping-ponged loops get an even trip count: mlir-air before PR #2000 (2026-09) unrolled odd trip counts
    into a third buffer whose DMA could send unwritten data (designs.md 6)."""
    return steps == 1 or steps % 2 == 0


@dataclass(frozen=True)
class GemvPlan:
    """Herd [herd_x, herd_y] in a launch of one iteration; tile (tx, ty) is number t = tx*herd_y + ty, owns output
    rows [t*rows_per_tile, (t+1)*rows_per_tile) and accumulates them in an L1 buffer stored to L3 once.
    Every tile has ONE inbound stream straight from L3 (its own shim MM2S channel, so up to GEMV_MAX_TILES = 16
    tiles stream weights at once): first the whole x (kept in L1), then its weight rows as [tile_m, k_chunk]
    blocks (one per step, ping-ponged). K is chunked only with one row per step, so the blocks, in the order the
    tile consumes them, are one contiguous run of w: one linear shim transfer, exempt from the BD wrap/iteration
    limits. The external kernel carries f32 partial sums across the k/k_chunk chunks of a row."""

    m: int
    k: int
    herd_x: int      # herd columns (<= NPU2_COLS)
    herd_y: int      # herd rows (1, or 2 when more than NPU2_COLS tiles stream)
    tile_m: int      # w rows per step
    k_chunk: int     # w columns per step

    @property
    def tiles(self) -> int:
        return self.herd_x * self.herd_y

    @property
    def rows_per_tile(self) -> int:
        return self.m // self.tiles

    @property
    def row_steps(self) -> int:
        return self.rows_per_tile // self.tile_m

    @property
    def k_steps(self) -> int:
        return self.k // self.k_chunk

    @property
    def steps(self) -> int:
        """Trips of the innermost loop, which holds the streamed weight block (the one ping-pong applies to)."""
        return self.k_steps if self.k_steps > 1 else self.row_steps

    @property
    def pingpong(self) -> bool:
        return self.steps >= 2

    @property
    def contiguous_stream(self) -> bool:
        """A tile's weight blocks, in the order it consumes them, are one contiguous run of w (whole rows, or one
        row per step): its stream is one linear shim transfer, exempt from the BD wrap limits."""
        return self.k_steps == 1 or self.tile_m == 1

    @property
    def core_task_repeats(self) -> int:
        """Runs of the core DMA task that receives a tile's weight blocks (a BD per buffer copy, the chain
        repeated): the real lowering's `aie.dma_start(S2MM, ..., repeat_count = runs - 1)`."""
        c = _copies(self.steps)
        return -(-self.row_steps * self.k_steps // c)

    def l1_buffers(self) -> dict[str, int]:
        return {"w": _copies(self.steps) * BF16 * self.tile_m * self.k_chunk, "x": BF16 * self.k,
                "acc_f32": F32 * self.tile_m, "y": BF16 * self.rows_per_tile}

    def l1_bytes(self) -> int:
        return sum(self.l1_buffers().values())

    def stream_bytes(self) -> int:
        """Bytes on one tile's shim stream (x, then its weight rows)."""
        return BF16 * (self.k + self.rows_per_tile * self.k)


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
        c = _copies(self.steps)
        out = {name: c * BF16 * n for name, n in self.inputs}
        out["y"] = BF16 * self.chunk_elements
        return out

    def l1_bytes(self) -> int:
        return sum(self.l1_buffers().values())


@dataclass(frozen=True)
class RopePlan:
    """Herd [herd, 1] split over position rows (prefill: tile t owns rows_per_tile consecutive rows, all heads)
    or over heads (decode, rows < NPU2_COLS: tile t owns heads_per_tile consecutive heads of every row). Per step
    a [step_rows, step_heads*head_dim] block of x and the step_rows LUT rows are DMA'd, one external call
    rotates them, the block is stored."""

    herd: int
    split: str              # "rows" | "heads"
    rows_per_tile: int
    heads_per_tile: int
    step_rows: int
    step_heads: int
    head_dim: int

    @property
    def steps(self) -> int:
        return (self.rows_per_tile // self.step_rows) * (self.heads_per_tile // self.step_heads)

    def l1_buffers(self) -> dict[str, int]:
        # the innermost emitted loop holds x and lut; a loop of one trip is not emitted
        inner = self.heads_per_tile // self.step_heads
        c = _copies(inner if inner > 1 else self.rows_per_tile // self.step_rows)
        block = self.step_rows * self.step_heads * self.head_dim
        return {"x": c * BF16 * block, "lut": c * BF16 * self.step_rows * self.head_dim, "y": BF16 * block}

    def l1_bytes(self) -> int:
        return sum(self.l1_buffers().values())


@dataclass(frozen=True)
class LmHeadPlan:
    n_parts: int     # GEMV launches over the vocabulary
    part_rows: int   # rows (vocab entries) per partition; n_parts*part_rows >= vocab, tail zero-padded
    gemv: GemvPlan   # the plan of each partition's GEMV


# --- planners ------------------------------------------------------------------------------------------
def gemv_herd_shape(tiles: int) -> tuple[int, int] | None:
    """The herd of `tiles` GEMV tiles: [tiles, 1] up to a row of NPU2_COLS, else two rows [tiles/2, 2] (each tile
    one shim stream: two per column); None when no such herd exists."""
    if tiles <= NPU2_COLS:
        return tiles, 1
    if tiles % 2 == 0 and tiles // 2 <= NPU2_COLS:
        return tiles // 2, 2
    return None


def plan_gemv(m: int, k: int) -> GemvPlan:
    check_positive("gemv", m=m, k=k)
    if k % GEMV_K_MULTIPLE:
        raise ValueError(f"gemv: k={k} must be a multiple of {GEMV_K_MULTIPLE} "
                         f"(AIE2P 32-lane bf16 vector path of the external kernel)")
    # each tile stores its rows once: rows_per_tile * 2 bytes must be a whole number of 32-bit words
    counts = [t for t in _divisors_desc(m, GEMV_MAX_TILES) if (m // t) % 2 == 0 and gemv_herd_shape(t)]
    if not counts:
        raise ValueError(f"gemv: m={m} must be even (each tile stores its outputs as whole 32-bit words)")
    chunks = [c for c in _divisors_desc(k, k) if c % GEMV_K_MULTIPLE == 0]
    for tiles in counts:  # the most weight streams first
        hx, hy = gemv_herd_shape(tiles)
        rows = m // tiles
        best, best_key = None, None
        for tile_m in _divisors_desc(rows, MAX_GEMV_TILE_M):
            for kc in chunks:
                plan = GemvPlan(m, k, hx, hy, tile_m, kc)
                if plan.l1_bytes() > L1_BUDGET or not plan.contiguous_stream \
                        or plan.core_task_repeats > CORE_TASK_MAX_REPEATS:
                    continue
                # prefer: a safe ping-pong trip count, then the most weight bytes per step (fewer steps), then
                # longer K chunks (whole rows: no partial-sum carry), then more rows per step
                key = (_even_or_one(plan.steps), tile_m * kc, kc, tile_m)
                if best_key is None or key > best_key:
                    best, best_key = plan, key
        if best is not None:
            return best
    t = counts[0]
    rows = m // t
    need = GemvPlan(m, k, *gemv_herd_shape(t), 1, GEMV_K_MULTIPLE).l1_bytes()
    if need > L1_BUDGET:
        raise ValueError(f"gemv: m={m}, k={k} needs {_kib(need)} of L1 per tile (x of {k} elements and {rows} "
                         f"output rows per tile stay in L1); the NPU2 limit is {_kib(L1_BUDGET)} "
                         f"({L1_BYTES // KiB} KiB minus {L1_STACK_RESERVE // KiB} KiB stack reserve): "
                         f"split {'k' if BF16 * k > L1_BUDGET // 2 else 'm into partitions'}")
    raise ValueError(f"gemv: m={m}, k={k}: {rows} output rows per tile take more weight blocks than one core DMA "
                     f"task repeats ({CORE_TASK_MAX_REPEATS} runs of the ping-pong pair): split m into partitions")


def _flat_plan(kernel: str, n_units: int, group: int, inputs: tuple[tuple[str, int], ...], multiple: int,
               max_chunk: int, unit: str) -> RowPlan | None:
    """The best RowPlan over n_units units of `group` elements; `inputs` = (name, elements per unit) of the
    DMA-filled input buffers. Chunks hold a multiple of `multiple` elements (vector width)."""
    best, best_key = None, None
    for herd in _divisors_desc(n_units, NPU2_COLS):
        per = n_units // herd
        for chunk in _divisors_desc(per, max(1, max_chunk // group)):
            elems = chunk * group
            if elems % multiple:
                continue
            plan = RowPlan(herd, per, chunk, unit, group, tuple((nm, chunk * e) for nm, e in inputs))
            if plan.l1_bytes() > L1_BUDGET:
                continue
            # prefer: a safe ping-pong trip count, chunks that amortise a DMA, then the widest herd, then the
            # biggest chunk
            key = (_even_or_one(plan.steps), elems >= min(MIN_ELEMWISE_CHUNK, group * n_units), herd, elems)
            if best_key is None or key > best_key:
                best, best_key = plan, key
    return best


def plan_rmsnorm(rows: int, dim: int, group: int = 0) -> RowPlan:
    check_positive("rmsnorm", rows=rows, dim=dim)
    g = group or dim
    if dim % g:
        raise ValueError(f"rmsnorm: group={group} does not divide dim={dim}")
    if g % RMSNORM_GROUP_MULTIPLE:
        raise ValueError(f"rmsnorm: group={g} must be a multiple of {RMSNORM_GROUP_MULTIPLE} "
                         f"(32-lane bf16 vector path of the external kernel)")
    plan = _flat_plan("rmsnorm", rows * (dim // g), g, (("x", g), ("w", 0)), RMSNORM_GROUP_MULTIPLE,
                      max(g, MAX_ELEMWISE_CHUNK), "groups")
    if plan is None:
        raise ValueError(f"rmsnorm: dim={dim} needs {_kib(5 * BF16 * g)} of L1 per tile for one group of {g} "
                         f"elements (x and w double-buffered, y); the NPU2 limit is {_kib(L1_BUDGET)}")
    # the weight is one [group] buffer per step, not chunk-sized
    return RowPlan(plan.herd, plan.units_per_tile, plan.chunk, plan.unit, g, (("x", plan.chunk * g), ("w", g)))


def _plan_elementwise(kernel: str, rows: int, dim: int, inputs: tuple[str, ...], multiple: int) -> RowPlan:
    check_positive(kernel, rows=rows, dim=dim)
    plan = _flat_plan(kernel, rows * dim, 1, tuple((nm, 1) for nm in inputs), multiple, MAX_ELEMWISE_CHUNK,
                      "elements")
    if plan is None:
        raise ValueError(f"{kernel}: dim={dim} x rows={rows} has no chunk that is a multiple of {multiple} "
                         f"(vector width) and at most {MAX_ELEMWISE_CHUNK} elements with "
                         f"{len(inputs)} double-buffered inputs and one output in {_kib(L1_BUDGET)} of L1")
    return plan


def plan_add(rows: int, dim: int) -> RowPlan:
    return _plan_elementwise("add", rows, dim, ("a", "b"), ADD_N_MULTIPLE)


def plan_swiglu(rows: int, dim: int) -> RowPlan:
    return _plan_elementwise("swiglu", rows, dim, ("gate", "up"), SWIGLU_N_MULTIPLE)


def plan_rope(rows: int, heads: int, head_dim: int) -> RopePlan:
    check_positive("rope", rows=rows, heads=heads, head_dim=head_dim)
    if head_dim % 2:
        raise ValueError(f"rope: head_dim={head_dim} must be even (half-split rotation)")
    if head_dim % ROPE_HEAD_DIM_MULTIPLE:
        raise ValueError(f"rope: head_dim={head_dim} must be a multiple of {ROPE_HEAD_DIM_MULTIPLE} "
                         f"(16-lane bf16 vector halves of the external kernel)")
    if rows >= NPU2_COLS:
        herd = _herd(rows)
        cands = [RopePlan(herd, "rows", rows // herd, heads, cr, heads, head_dim)
                 for cr in _divisors_desc(rows // herd, rows // herd)]
    else:
        # decode: split the heads of each row, as many tiles as keep >= MIN_ELEMWISE_CHUNK elements per tile
        split = [h for h in _divisors_desc(heads, NPU2_COLS) if (heads // h) * head_dim >= MIN_ELEMWISE_CHUNK]
        herd = split[0] if split else 1
        cands = [RopePlan(herd, "heads", rows, heads // herd, cr, heads // herd, head_dim)
                 for cr in _divisors_desc(rows, rows)]
    fits = [p for p in cands if p.l1_bytes() <= L1_BUDGET
            and (p.step_rows == 1 or p.step_rows * p.step_heads * head_dim <= MAX_ELEMWISE_CHUNK)]
    if not fits:
        raise ValueError(f"rope: {heads} heads of head_dim={head_dim} need more than {_kib(L1_BUDGET)} of L1 "
                         f"per tile for one row")
    return max(fits, key=lambda p: (_even_or_one(p.steps), p.step_rows))


def plan_lm_head(vocab: int, hidden: int) -> LmHeadPlan:
    """Split the vocabulary projection into NPU2_COLS GEMV partitions of equal, nicely divisible size."""
    check_positive("lm_head", vocab=vocab, hidden=hidden)
    # round each partition up so it splits evenly over a full herd of max-size GEMV tiles; tiny vocabularies
    # (tests) use fewer partitions so the zero padding stays below one quantum per partition
    quantum = LM_HEAD_ROW_QUANTUM
    n_parts = max(1, min(NPU2_COLS, vocab // quantum))
    part_rows = -(-vocab // n_parts)
    part_rows = -(-part_rows // quantum) * quantum
    # prefer power-of-two partitions when that costs < 1/8 extra padding (reference: 8 x 16384 for 128256)
    p2 = 1 << (part_rows - 1).bit_length()
    if p2 * n_parts - vocab <= vocab // 8:
        part_rows = p2
    return LmHeadPlan(n_parts, part_rows, plan_gemv(part_rows, hidden))
