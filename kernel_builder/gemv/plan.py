"""The `gemv` kernel's tiling plan (GEMV y = W x): the integers its builder needs, or a ValueError naming
the dimension and the NPU2 limit."""
from __future__ import annotations

from dataclasses import dataclass

from kernel_builder.gemv.external import GEMV_K_MULTIPLE
from kernel_builder.hw.facts import NPU2
from kernel_builder.planner import (BF16, F32, L1_BUDGET, L1_BYTES, L1_STACK_RESERVE, NPU2_COLS, KiB, check_positive,
                                    divisors_desc, even_or_one, kib, pingpong_copies)

MAX_GEMV_TILE_M = 16          # rows per GEMV step (bigger steps amortise the per-step DMA/lock overhead)
GEMV_MAX_TILES = NPU2.shim_mm2s_total  # GEMV tiles streaming weights at once: one shim MM2S channel each, 2 per
                                       # column
CORE_TASK_MAX_REPEATS = NPU2.core_task_max_repeats  # runs of one core DMA task (its BD chain); the lowering gives a
                                                    # ping-ponged GEMV weight get one task of steps/2 runs of 2 BDs
LM_HEAD_ROW_QUANTUM = 64      # LM-head partitions are multiples of a full herd of 8-row tiles


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
    bias: bool = False   # gemv_bias: the tile's bias rows travel after x and stay in L1
    w_bits: int = 16     # bits per weight on the stream and in L1 (bf16: 16; block float, gemv_bfp: 9)
    row_quantum: int = 1  # output rows per weight-layout row group (block float: 8-row block rows)

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
        row (block float: one 8-row block row) per step): its stream is one linear shim transfer, exempt from the BD
        wrap limits."""
        return self.k_steps == 1 or self.tile_m == self.row_quantum

    @property
    def core_task_repeats(self) -> int:
        """Runs of the core DMA task that receives a tile's weight blocks (a BD per buffer copy, the chain
        repeated): the real lowering's `aie.dma_start(S2MM, ..., repeat_count = runs - 1)`."""
        c = pingpong_copies(self.steps)
        return -(-self.row_steps * self.k_steps // c)

    def l1_buffers(self) -> dict[str, int]:
        return {"w": pingpong_copies(self.steps) * self.tile_m * self.k_chunk * self.w_bits // 8, "x": BF16 * self.k,
                "acc_f32": F32 * self.tile_m, "y": BF16 * self.rows_per_tile,
                **({"b": BF16 * self.rows_per_tile} if self.bias else {})}   # b: after x, in x's buffer

    def l1_bytes(self) -> int:
        return sum(self.l1_buffers().values())

    def stream_bytes(self) -> int:
        """Bytes on one tile's shim stream (x, its bias rows, then its weight rows)."""
        return BF16 * (self.k + self.rows_per_tile * self.bias) + self.rows_per_tile * self.k * self.w_bits // 8


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


def gemv_tile_counts(kind: str, m: int) -> list[int]:
    """The tile counts a GEMV of m output rows may use (gemv, gemv_q4), the most weight streams first: divisors
    of m up to GEMV_MAX_TILES that make a herd and store each tile's rows once as whole 32-bit words
    (rows_per_tile * 2 bytes); a ValueError when there is none."""
    counts = [t for t in divisors_desc(m, GEMV_MAX_TILES) if (m // t) % 2 == 0 and gemv_herd_shape(t)]
    if not counts:
        raise ValueError(f"{kind}: m={m} must be even (each tile stores its outputs as whole 32-bit words)")
    return counts


def first_best(m: int, counts: list[int], candidates):
    """The plan of the first tile count in `counts` that has one: `candidates(herd_x, herd_y, rows_per_tile)`
    yields (plan, preference key) for every plan that fits; the highest key wins (the first on a tie)."""
    for tiles in counts:
        hx, hy = gemv_herd_shape(tiles)
        best, best_key = None, None
        for plan, key in candidates(hx, hy, m // tiles):
            if best_key is None or key > best_key:
                best, best_key = plan, key
        if best is not None:
            return best
    return None


def plan_gemv(m: int, k: int, bias: bool = False) -> GemvPlan:
    check_positive("gemv", m=m, k=k)
    if k % GEMV_K_MULTIPLE:
        raise ValueError(f"gemv: k={k} must be a multiple of {GEMV_K_MULTIPLE} "
                         f"(AIE2P 32-lane bf16 vector path of the external kernel)")
    return plan_gemv_rows("gemv", m, k, bias, gemv_tile_counts("gemv", m), GEMV_K_MULTIPLE)


def plan_gemv_rows(kind: str, m: int, k: int, bias: bool, counts: list[int], k_multiple: int, w_bits: int = 16,
                   row_quantum: int = 1) -> GemvPlan:
    """The GEMV plan over the tile counts `counts` (the most weight streams first) for weights of `w_bits` bits
    streamed in groups of `row_quantum` rows (gemv: bf16 rows; gemv_bfp: 8-row block-float block rows), K chunks
    multiples of `k_multiple`; a ValueError naming the limit when none fits."""
    chunks = [c for c in divisors_desc(k, k) if c % k_multiple == 0]

    def candidates(hx, hy, rows):
        for tile_m in divisors_desc(rows, MAX_GEMV_TILE_M):
            if tile_m % row_quantum:
                continue
            for kc in chunks:
                plan = GemvPlan(m, k, hx, hy, tile_m, kc, bias, w_bits, row_quantum)
                if plan.l1_bytes() > L1_BUDGET or not plan.contiguous_stream \
                        or plan.core_task_repeats > CORE_TASK_MAX_REPEATS:
                    continue
                # prefer: a safe ping-pong trip count, then the most weight bytes per step (fewer steps), then
                # longer K chunks (whole rows: no partial-sum carry), then more rows per step
                yield plan, (even_or_one(plan.steps), tile_m * kc, kc, tile_m)

    best = first_best(m, counts, candidates)
    if best is not None:
        return best
    t = counts[0]
    rows = m // t
    need = GemvPlan(m, k, *gemv_herd_shape(t), row_quantum, k_multiple, bias, w_bits, row_quantum).l1_bytes()
    if need > L1_BUDGET:
        raise ValueError(f"{kind}: m={m}, k={k} needs {kib(need)} of L1 per tile (x of {k} elements and {rows} "
                         f"output rows per tile stay in L1); the NPU2 limit is {kib(L1_BUDGET)} "
                         f"({L1_BYTES // KiB} KiB minus {L1_STACK_RESERVE // KiB} KiB stack reserve): "
                         f"split {'k' if BF16 * k > L1_BUDGET // 2 else 'm into partitions'}")
    raise ValueError(f"{kind}: m={m}, k={k}: {rows} output rows per tile take more weight blocks than one core DMA "
                     f"task repeats ({CORE_TASK_MAX_REPEATS} runs of the ping-pong pair): split m into partitions")


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
    plan = plan_gemv(part_rows, hidden)
    # a partition whose GEMV steps are an odd count (e.g. 25024 rows of a 200064 vocabulary: 391 steps of 4 rows
    # per tile) gets a third weight buffer (planner.even_or_one): grow it to whole 16-row steps of a full herd
    full = GEMV_MAX_TILES * MAX_GEMV_TILE_M
    if not even_or_one(plan.steps) and part_rows % full:
        part_rows = -(-part_rows // full) * full
        plan = plan_gemv(part_rows, hidden)
    return LmHeadPlan(n_parts, part_rows, plan)
