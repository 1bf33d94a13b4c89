"""NPU2 (AIE2P) limits and the tiling plans of every kernel.

A plan is the small set of integers a builder needs (tile sizes, herd shape, chunking). Every `plan_<kind>`
either returns a plan that fits the hardware limits below or raises `ValueError` naming the kernel, the
dimension and the limit, so an untileable model shape fails at build time, not on the device.
"""
from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

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
MAX_GEMV_TILE_M = 8           # rows per GEMV call: more rows only lengthen the pipeline fill
MAX_GEMM_TILE = 128           # largest L1 GEMM tile edge considered
MAX_ELEMWISE_CHUNK = 4096     # elements per elementwise L1 chunk: beyond this DMA overhead is already amortised
MIN_ELEMWISE_CHUNK = 256      # below this a chunk's DMA setup dominates; spread over fewer tiles instead

# External C++ vector-path granularity (must agree with kernel_builder.externals).
GEMV_K_MULTIPLE = 32
ROPE_HEAD_DIM_MULTIPLE = 32
SWIGLU_N_MULTIPLE = 16
ATTN_HEAD_DIM_MULTIPLE = 32
ATTN_LK_MULTIPLE = 16         # keys per K/V tile: whole 16-lane softmax vectors
ATTN_LQ_MULTIPLE = 8          # prefill query rows per tile: whole 8-row bf16 mmul blocks (AIE2P mmul<8, 8, 4>)
ATTN_MAX_LQ = 64              # prefill query rows per tile considered
ATTN_PREFILL_LK = (32, 16)    # prefill K/V tile lengths considered (largest first)
ATTN_DECODE_LK = (64, 32, 16)  # decode K/V tile lengths considered (largest first)
SHIM_MM2S = 2 * NPU2_COLS     # shim DMA channels of the array: 2 MM2S + 2 S2MM per column
SHIM_S2MM = 2 * NPU2_COLS


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
@dataclass(frozen=True)
class GemmPlan:
    """One herd tile owns a [tile_m, tile_n] output tile for the whole K reduction (f32 accumulator in L1).
    Per K step the segment stages an A row panel [herd_m*tile_m, tile_k] and a B column panel
    [tile_k, herd_n*tile_n] in L2 (L3 -> memory tile) and broadcasts their [tile_m, tile_k] / [tile_k, tile_n]
    slices to the herd's rows / columns over air.channel."""

    tile_m: int      # output rows per compute tile (L1)
    tile_k: int      # K depth of one L1 A/B tile (one linalg.matmul per K step)
    tile_n: int      # output cols per compute tile (L1)
    herd_m: int      # herd extent over M (columns of the array)
    herd_n: int      # herd extent over N (rows of the array)

    def l1_buffers(self) -> dict[str, int]:
        return {"acc_f32": F32 * self.tile_m * self.tile_n,
                "a_tiles": 2 * BF16 * self.tile_m * self.tile_k,    # double-buffered
                "b_tiles": 2 * BF16 * self.tile_k * self.tile_n,    # double-buffered
                "out_bf16": BF16 * self.tile_m * self.tile_n}

    def l1_bytes(self) -> int:
        return sum(self.l1_buffers().values())

    def l2_buffers(self) -> dict[str, int]:
        """Memory-tile buffers, double-buffered (the DMA of step k+1 overlaps the broadcast of step k).
        The accumulator never leaves L1."""
        return {"a_panels": 2 * BF16 * self.herd_m * self.tile_m * self.tile_k,
                "b_panels": 2 * BF16 * self.tile_k * self.herd_n * self.tile_n}

    def l2_bytes(self) -> int:
        return sum(self.l2_buffers().values())

    def ddr_read_bytes(self, m: int, k: int, n: int) -> int:
        """DDR bytes read by one GEMM: each launch block [BM, BN] reads its A row block and B column block
        once (the panels are broadcast on chip), so A is read n/BN times and B m/BM times."""
        bm, bn = self.herd_m * self.tile_m, self.herd_n * self.tile_n
        return BF16 * (m * k * (n // bn) + k * n * (m // bm))


@dataclass(frozen=True)
class GemvPlan:
    tile_m: int          # W rows per external-kernel call (L1 tile [tile_m, k])
    herd_m: int          # tiles splitting the output rows
    double_buffer: bool  # whether two W tiles fit L1 (ping-pong)

    def l1_bytes(self, k: int) -> int:
        return (2 if self.double_buffer else 1) * BF16 * self.tile_m * k + BF16 * k + 2 * BF16 * self.tile_m


@dataclass(frozen=True)
class RowPlan:
    """Row-parallel / elementwise kernels. `unit` says what `chunk` counts: 'rows' (rmsnorm: rows per L1
    tile), 'elements' (add/swiglu: elements per L1 chunk, always a divisor of dim) or 'heads' (rope: heads
    of one position row per call)."""

    herd: int            # tiles in the (herd, 1) herd
    units_per_tile: int  # rows (rmsnorm/rope) or chunks (add/swiglu) each tile processes
    chunk: int
    unit: str


@dataclass(frozen=True)
class AttentionPlan:
    """Tiling of the `attention` kernel (kernel_builder/kernels/attention.py) for one shape. The launch walks the
    kv heads (one per iteration).

    Prefill (rows > 1): `herd_x` groups (columns) of `herd_y` cores. The cores of a group run `herd_y` query
    heads of the GQA group on one query block; the groups run `herd_x` query blocks side by side (rounds of
    herd_x blocks, interleaved). Each group has one item stream (an L2 item buffer per step, broadcast to its
    cores) fed from L3 by two channels (item rows [0, lk) and [lk, 2lk)): first its Q tiles (one item per
    head), then the K/V tiles of the whole window. Each core writes its output tile to L3.
    Decode (rows == 1): `herd_x` splits of the KV window (herd_y = 1); each core folds the `lq` = group query
    heads over its share into an online-softmax partial; a one-core merge herd combines the herd_x partials.
    """

    rows: int
    kv_rows: int
    heads: int
    kv_heads: int
    head_dim: int
    lq: int          # query rows per core tile (decode: the GQA group's heads, all at the position)
    lk: int          # K/V rows per tile
    herd_x: int      # prefill: query blocks side by side; decode: splits of the KV window
    herd_y: int      # prefill: query heads of one GQA group side by side (sharing a stream); decode: 1

    @property
    def decode(self) -> bool:
        return self.rows == 1

    @property
    def group(self) -> int:
        return self.heads // self.kv_heads

    @property
    def launch(self) -> int:
        """Launch iterations: one per kv head."""
        return self.kv_heads

    @property
    def item_rows(self) -> int:
        """Rows of one item of a core's input stream: prefill [K tile; V tile] (a Q item has the same size),
        decode [K tile; V tile; the group's query rows]."""
        return 2 * self.lk + (self.lq if self.decode else 0)

    @property
    def head_passes(self) -> int:
        return 1 if self.decode else self.group // self.herd_y

    @property
    def rounds(self) -> int:
        return 1 if self.decode else self.rows // self.lq // self.herd_x

    @property
    def q_items(self) -> int:
        """Prefill: items carrying a group's Q tiles (one per core of the group)."""
        return 0 if self.decode else self.herd_y

    @property
    def share(self) -> int:
        """KV positions one core streams per pass (decode: a split of the window; prefill: the window)."""
        return self.kv_rows // self.herd_x if self.decode else self.kv_rows

    @property
    def kv_tiles(self) -> int:
        return self.share // self.lk

    @property
    def state_floats(self) -> int:
        """f32 online-softmax state of one core tile: acc [lq, hd], then m [lq], then l [lq]."""
        return self.lq * (self.head_dim + 2)

    @property
    def cores(self) -> int:
        return self.herd_x * self.herd_y + (1 if self.decode else 0)

    def l1_buffers(self) -> dict[str, int]:
        """Per core tile (the item buffer is ping-ponged: two copies)."""
        hd = self.head_dim
        out = {"items": 2 * BF16 * self.item_rows * hd, "state": F32 * self.state_floats, "pos": 4}
        if not self.decode:
            out["q_out"] = BF16 * self.lq * hd   # the core's Q tile, then its output tile
        return out

    def l1_merge_buffers(self) -> dict[str, int]:
        """Decode merge core: the herd_x partials and the output rows."""
        return {"partials": F32 * self.herd_x * self.state_floats, "out": BF16 * self.lq * self.head_dim}

    def l1_bytes(self) -> int:
        return max(sum(self.l1_buffers().values()),
                   sum(self.l1_merge_buffers().values()) if self.decode else 0)

    def l2_buffers(self) -> dict[str, int]:
        """Memory-tile buffers (streamed ones with their ping-pong copy), one entry per buffer."""
        hd = self.head_dim
        out = {"pos": 4}
        if self.decode:
            for x in range(self.herd_x):
                out[f"kv{x}"] = 2 * BF16 * self.item_rows * hd
            out["partials"] = F32 * self.herd_x * self.state_floats
        else:
            for x in range(self.herd_x):   # per group: its item buffer (ping-pong)
                out[f"items{x}"] = 2 * BF16 * self.item_rows * hd
        return out

    def l2_bytes(self) -> int:
        return sum(self.l2_buffers().values())

    def channels(self) -> dict[str, int]:
        """DMA streams of one launch by endpoint (the budget docs/kernels.md tabulates): shim MM2S/S2MM (DDR
        reads/writes), memory-tile S2MM/MM2S (into/out of L2), and per core tile S2MM/MM2S."""
        x, y = self.herd_x, self.herd_y
        if self.decode:   # per split: K, V, q DMAs and one put; partials gathered in L2, one put to the merge
            return {"shim_mm2s": 3 * x + 1, "shim_s2mm": 1, "memtile_s2mm": 3 * x + 1 + x,
                    "memtile_mm2s": x + 1 + 1, "core_s2mm": 2, "core_mm2s": 1}
        # pos; per group its two feed channels (Q, then K / Q, then V) and one put; each core's output tile to L3
        return {"shim_mm2s": 2 * x + 1, "shim_s2mm": x * y, "memtile_s2mm": 2 * x + 1, "memtile_mm2s": x + 1,
                "core_s2mm": 2, "core_mm2s": 1}

    def core_bds(self) -> int:
        """BDs per core tile: pos (1) + the ping-ponged item buffer (2) + the output / partial (1)."""
        return 4


@dataclass(frozen=True)
class LmHeadPlan:
    n_parts: int     # GEMV launches over the vocabulary
    part_rows: int   # rows (vocab entries) per partition; n_parts*part_rows >= vocab, tail zero-padded
    gemv: GemvPlan   # the plan of each partition's GEMV


# --- planners ------------------------------------------------------------------------------------------
def plan_gemv(m: int, k: int) -> GemvPlan:
    check_positive("gemv", m=m, k=k)
    if k % GEMV_K_MULTIPLE:
        raise ValueError(f"gemv: k={k} must be a multiple of {GEMV_K_MULTIPLE} "
                         f"(AIE2P 32-lane bf16 vector path of the external kernel)")
    herd = _herd(m)
    rows_per_tile = m // herd
    for double_buffer in (True, False):
        for tile_m in _divisors_desc(rows_per_tile, MAX_GEMV_TILE_M):
            plan = GemvPlan(tile_m, herd, double_buffer)
            if plan.l1_bytes(k) <= L1_BUDGET:
                return plan
    need = GemvPlan(1, herd, False).l1_bytes(k)
    raise ValueError(f"gemv: k={k} needs {_kib(need)} of L1 per tile for tile_m=1; the NPU2 limit is "
                     f"{_kib(L1_BUDGET)} ({L1_BYTES // KiB} KiB minus {L1_STACK_RESERVE // KiB} KiB stack reserve)")


def plan_gemm(m: int, k: int, n: int) -> GemmPlan:
    check_positive("gemm", m=m, k=k, n=n)
    for name, v, q in (("m", m, MMUL_M), ("k", k, MMUL_K), ("n", n, MMUL_N)):
        if v % q:
            raise ValueError(f"gemm: {name}={v} must be a multiple of {q} (AIE2P bf16 matmul intrinsic "
                             f"{MMUL_M}x{MMUL_K}x{MMUL_N}); use gemv for single-row products")
    edge = [t for t in range(MAX_GEMM_TILE, 0, -MMUL_M)]
    best, best_key = None, None
    for tile_k in (64, 32, 16, 8):
        if k % tile_k:
            continue
        for tile_m in edge:
            if m % tile_m:
                continue
            herd_m = _herd(m // tile_m, NPU2_COLS)
            for tile_n in edge:
                if n % tile_n:
                    continue
                plan = GemmPlan(tile_m, tile_k, tile_n, herd_m, _herd(n // tile_n, NPU2_ROWS))
                # all L2 panels (double-buffered) must fit one memory tile: the segment's panels are
                # allocated together and AIR places a segment's L2 buffers per memory tile
                if plan.l1_bytes() > L1_BUDGET or plan.l2_bytes() > MEMTILE_BYTES:
                    continue
                # prefer: more tiles busy, then fewer bytes streamed into each tile per MAC (its A/B tiles
                # arrive every K step: (tile_m + tile_n) / (tile_m * tile_n); with a full herd this also
                # minimises DDR reads, 1/BM + 1/BN per MAC), then more MACs per tile
                key = (plan.herd_m * plan.herd_n, Fraction(tile_m * tile_n, tile_m + tile_n), tile_m * tile_n)
                if best_key is None or key > best_key:
                    best, best_key = plan, key
        if best is not None:
            return best
    raise ValueError(f"gemm: m={m}, k={k}, n={n} has no tiling whose L1 buffers (f32 accumulator, 2x A and "
                     f"2x B bf16 tiles, bf16 output tile) fit {_kib(L1_BUDGET)} per tile and whose "
                     f"double-buffered L2 A/B panels fit one {_kib(MEMTILE_BYTES)} memory tile")


def plan_rmsnorm(rows: int, dim: int) -> RowPlan:
    check_positive("rmsnorm", rows=rows, dim=dim)
    herd = _herd(rows)
    per_tile = rows // herd
    for chunk in _divisors_desc(per_tile, per_tile):
        if 2 * 2 * BF16 * chunk * dim + BF16 * dim <= L1_BUDGET:  # x and y double-buffered + weight
            return RowPlan(herd, per_tile, chunk, "rows")
    need = 2 * 2 * BF16 * dim + BF16 * dim
    raise ValueError(f"rmsnorm: dim={dim} needs {_kib(need)} of L1 per tile for one row; "
                     f"the NPU2 limit is {_kib(L1_BUDGET)}")


def _plan_elementwise(kernel: str, rows: int, dim: int, n_buffers: int, multiple: int) -> RowPlan:
    check_positive(kernel, rows=rows, dim=dim)
    cap = min(MAX_ELEMWISE_CHUNK, L1_BUDGET // (2 * n_buffers * BF16))  # all buffers double-buffered
    chunks = [c for c in _divisors_desc(dim, cap) if c % multiple == 0]
    if not chunks:
        raise ValueError(f"{kernel}: dim={dim} has no divisor that is a multiple of {multiple} "
                         f"(vector width) and at most {cap} elements (L1 limit {_kib(L1_BUDGET)} for "
                         f"{n_buffers} double-buffered bf16 buffers)")
    # prefer full 32-lane vectors when a divisor allows it; then the widest herd among chunks that still
    # amortise a DMA (>= MIN_ELEMWISE_CHUNK elements); then the biggest chunk
    vec = [c for c in chunks if c % VECTOR_LANES_BF16 == 0] or chunks
    big = [c for c in vec if c >= MIN_ELEMWISE_CHUNK] or vec[:1]
    chunk = max(big, key=lambda c: (_herd(rows * dim // c), c))
    n_chunks = rows * dim // chunk
    herd = _herd(n_chunks)
    return RowPlan(herd, n_chunks // herd, chunk, "elements")


def plan_add(rows: int, dim: int) -> RowPlan:
    return _plan_elementwise("add", rows, dim, 3, 1)


def plan_swiglu(rows: int, dim: int) -> RowPlan:
    return _plan_elementwise("swiglu", rows, dim, 3, SWIGLU_N_MULTIPLE)


def plan_rope(rows: int, heads: int, head_dim: int) -> RowPlan:
    check_positive("rope", rows=rows, heads=heads, head_dim=head_dim)
    if head_dim % 2:
        raise ValueError(f"rope: head_dim={head_dim} must be even (half-split rotation)")
    if head_dim % ROPE_HEAD_DIM_MULTIPLE:
        raise ValueError(f"rope: head_dim={head_dim} must be a multiple of {ROPE_HEAD_DIM_MULTIPLE} "
                         f"(16-lane bf16 vector halves of the external kernel)")
    herd = _herd(rows)
    for hc in _divisors_desc(heads, heads):
        if 2 * 2 * BF16 * hc * head_dim + 2 * BF16 * head_dim <= L1_BUDGET:  # x, y, lut double-buffered
            return RowPlan(herd, rows // herd, hc, "heads")
    raise ValueError(f"rope: head_dim={head_dim} needs more than {_kib(L1_BUDGET)} of L1 per tile for one head")


def _attention_checks(rows: int, kv_rows: int, heads: int, kv_heads: int, head_dim: int) -> None:
    check_positive("attention", rows=rows, kv_rows=kv_rows, heads=heads, kv_heads=kv_heads, head_dim=head_dim)
    if heads % kv_heads:
        raise ValueError(f"attention: heads={heads} must be divisible by kv_heads={kv_heads} (GQA groups)")
    if head_dim % 2:
        raise ValueError(f"attention: head_dim={head_dim} must be even")
    if head_dim % ATTN_HEAD_DIM_MULTIPLE:
        raise ValueError(f"attention: head_dim={head_dim} must be a multiple of {ATTN_HEAD_DIM_MULTIPLE} "
                         f"(32-lane bf16 vector path of the external kernel)")
    if rows > kv_rows:
        raise ValueError(f"attention: rows={rows} exceed the KV window kv_rows={kv_rows} (the chunk's own keys "
                         f"are part of the window)")
    if kv_rows % ATTN_LK_MULTIPLE:
        raise ValueError(f"attention: kv_rows={kv_rows} must be a multiple of {ATTN_LK_MULTIPLE} (K/V tiles "
                         f"of 16-lane softmax vectors)")


def _attention_fits(p: AttentionPlan) -> bool:
    return (p.l1_bytes() <= L1_BUDGET and all(b <= MEMTILE_BYTES for b in p.l2_buffers().values())
            and p.l2_bytes() <= L2_BUDGET and p.channels()["shim_mm2s"] <= SHIM_MM2S
            and p.channels()["shim_s2mm"] <= SHIM_S2MM and p.cores <= NPU2_COLS * NPU2_ROWS)


def plan_attention(rows: int, kv_rows: int, heads: int, kv_heads: int, head_dim: int) -> AttentionPlan:
    """Tiling of causal GQA attention of `rows` query rows over a `kv_rows` KV window (rows == 1: decode)."""
    _attention_checks(rows, kv_rows, heads, kv_heads, head_dim)
    args = (rows, kv_rows, heads, kv_heads, head_dim)
    group = heads // kv_heads
    best, best_key = None, None
    if rows == 1:
        # decode: herd_x splits of the window, each one column's K, V and q DMA streams (3 per split + pos
        # must fit the shim's MM2S channels), plus the merge core
        for herd_x in (8, 4, 2, 1):
            if kv_rows % (herd_x * ATTN_LK_MULTIPLE) or 3 * herd_x + 1 > SHIM_MM2S:
                continue
            for lk in ATTN_DECODE_LK:
                if (kv_rows // herd_x) % lk:
                    continue
                p = AttentionPlan(*args, lq=group, lk=lk, herd_x=herd_x, herd_y=1)
                if _attention_fits(p):
                    return p
    else:
        herd_y = _herd(group, NPU2_ROWS)
        for lq in _divisors_desc(rows, ATTN_MAX_LQ):
            if lq % ATTN_LQ_MULTIPLE:
                continue
            for lk in ATTN_PREFILL_LK:
                if kv_rows % lk or not lk <= lq <= 2 * lk:   # a Q tile travels in one item: two lk-row halves
                    continue
                # groups: 2 feed streams each + pos within the shim's MM2S channels, one output stream per
                # core within its S2MM channels
                n_qb = rows // lq
                herd_x = next(d for d in _divisors_desc(n_qb, NPU2_COLS)
                              if 2 * d + 1 <= SHIM_MM2S and d * herd_y <= SHIM_S2MM)
                p = AttentionPlan(*args, lq=lq, lk=lk, herd_x=herd_x, herd_y=herd_y)
                if not _attention_fits(p):
                    continue
                # prefer more busy cores, then bigger tiles (fewer Q re-streams and steps)
                key = (p.cores, lq, lk)
                if best_key is None or key > best_key:
                    best, best_key = p, key
    if best is None:
        what = "decode" if rows == 1 else f"prefill (query tiles must divide rows={rows} in multiples of " \
                                          f"{ATTN_LQ_MULTIPLE})"
        raise ValueError(f"attention: no {what} tiling of rows={rows}, kv_rows={kv_rows}, head_dim={head_dim} fits "
                         f"{_kib(L1_BUDGET)} of L1 per tile, one {_kib(MEMTILE_BYTES)} memory tile per L2 buffer and "
                         f"{SHIM_MM2S} shim MM2S channels")
    return best


def plan_lm_head(vocab: int, hidden: int) -> LmHeadPlan:
    """Split the vocabulary projection into NPU2_COLS GEMV partitions of equal, nicely divisible size."""
    check_positive("lm_head", vocab=vocab, hidden=hidden)
    # round each partition up so it splits evenly over a full herd of max-size GEMV tiles; tiny vocabularies
    # (tests) use fewer partitions so the zero padding stays below one quantum per partition
    quantum = NPU2_COLS * MAX_GEMV_TILE_M
    n_parts = max(1, min(NPU2_COLS, vocab // quantum))
    part_rows = -(-vocab // n_parts)
    part_rows = -(-part_rows // quantum) * quantum
    # prefer power-of-two partitions when that costs < 1/8 extra padding (reference: 8 x 16384 for 128256)
    p2 = 1 << (part_rows - 1).bit_length()
    if p2 * n_parts - vocab <= vocab // 8:
        part_rows = p2
    return LmHeadPlan(n_parts, part_rows, plan_gemv(part_rows, hidden))
