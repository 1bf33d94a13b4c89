"""The `attention` kernel's tiling plan (kernel_builder/attention/builder.py): causal GQA attention of a
prefill chunk (rows > 1) or a decode row (rows == 1) over a KV window.

`plan_attention(rows, kv_rows, heads, kv_heads, head_dim)` returns the `AttentionPlan` with the most busy
cores, then the least modeled work of the busiest core, within L1 (with the ping-pong copy of the item buffer),
one memory tile per L2 buffer and the shim's DMA channels, or raises ValueError naming the shape
(docs/kernels.md "attention"). The NPU2 limits it shares with the other plans come from kernel_builder.planner.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

from kernel_builder.attention.external import (ATTN_HEAD_DIM_MULTIPLE, ATTN_LK_MULTIPLE, ATTN_LQ_MULTIPLE,
                                               ATTN_ROW_BLOCK, attn_prefill_blocks)
from kernel_builder.attention import counts as ac
from kernel_builder.hw import cost
from kernel_builder.hw.facts import NPU2
from kernel_builder.planner import (BF16, F32, L1_BUDGET, L2_BUDGET, MEMTILE_BYTES, NPU2_COLS, NPU2_ROWS,
                                    check_positive, divisors_desc, kib)

ATTN_MAX_LQ = 64              # prefill query rows per tile considered
ATTN_PREFILL_LK = (64, 32, 16)  # prefill K/V tile lengths considered (largest first)
ATTN_DECODE_LK = (64, 32, 16)   # decode K/V tile lengths considered (largest first)
SHIM_MM2S = NPU2.shim_mm2s_total   # shim DMA channels of the array: 2 MM2S + 2 S2MM per column
SHIM_S2MM = NPU2.shim_s2mm_total
MEMTILE_CHANNELS = NPU2.memtile_s2mm  # S2MM (and MM2S) DMA channels of one memory tile: a gather buffer takes
                                      # at most this many core streams
N_CORES = NPU2.core_tiles
# a decode split's K/V tiles per launch iteration: each item carries the group's query rows again, read from DDR
# by one shim DMA task that runs once per tile (airrt-to-npu folds the loop into the task's repeat count)
DECODE_MAX_TILES = NPU2.bd_max_repeat_count + 1
# ... and when those rows are strided (herd_y kv heads of a group > 1 side by side) the task has 4 BD dims, whose
# outermost (the tiles) airrt-to-npu tiles below 64 into one task per part after the waits were made: the parts
# but the first are never freed and their BDs add up over a decode token's layers (query_rows_split)
NPU2_MEMTILES = NPU2.memtiles      # one memory tile per column
DECODE_ROW_BLOCK = NPU2.bf16_mmul_shape[0]   # decode step: query rows per block (attention.cc ATTN_MODE 2)


def _round_up(n: int, m: int) -> int:
    return -(-n // m) * m


def query_rows_split(herd_y: int, group: int, kv_tiles: int) -> bool:
    """Decode: whether airrt-to-npu would split a split's query-row read (re-read once per K/V tile, folded into
    one task's repeat count) - strided rows (herd_y kv heads of a group > 1 side by side: 4 BD dims) over 64 or
    more tiles (kernel_builder.hw.dma.wrap_split). Its extra parts keep their BDs to the end of the runtime
    sequence: a two-layer decode token of 4 x 128 tiles ran a shim tile out of BD IDs (docs/kernels.md,
    "decode attention"), so the planners take no such plan."""
    return herd_y > 1 and group > 1 and kv_tiles >= NPU2.bd_max_repeat


@dataclass(frozen=True)
class AttentionPlan:
    """Tiling of the `attention` kernel (kernel_builder/attention/builder.py) for one shape.

    Prefill (rows > 1): a herd of `herd_x` query blocks x `herd_y` query heads of one GQA group; all its cores
    share ONE item stream per launch iteration (an L2 item buffer broadcast to every core, 8x8-blocked by the
    L2 -> L1 DMA), fed from L3 by two channels (item rows [0, lk) and [lk, 2lk)): first the Q stream (the round's
    herd_x * lq rows of each head; core x keeps the 8-row blocks x, x + herd_x, ...: `qcycle`), then the K/V
    tiles of the whole window of the kv head. Each core's output tile goes to its group's L2 buffer
    (one per query block x: the herd_y heads side by side), written to L3 with one DMA per launch iteration.
    Launch grid [kv heads, rounds, head passes] (the runtime loop tiling of the first two dims bounds the
    output writes in flight per shim column; head passes, usually 1, stay whole in a tile).
    Decode (rows == 1): `herd_x` splits of the KV window x `herd_y` kv heads side by side; each core folds the
    `lq` = GQA group query rows of its kv head over its share into an online-softmax partial; a merge herd
    [1, herd_y] combines each kv head's herd_x partials. Launch grid [kv_heads / herd_y].
    """

    rows: int
    kv_rows: int
    heads: int
    kv_heads: int
    head_dim: int
    lq: int          # query rows per core tile (decode: the GQA group's heads, all at the position)
    lk: int          # K/V rows per tile
    herd_x: int      # prefill: query blocks side by side; decode: splits of the KV window
    herd_y: int      # prefill: query heads of one GQA group side by side; decode: kv heads side by side
    window: int = 0  # sliding window of keys (0: full causal): the cores skip the tiles before it

    @property
    def decode(self) -> bool:
        return self.rows == 1

    @property
    def group(self) -> int:
        return self.heads // self.kv_heads


    @property
    def launch_grid(self) -> tuple[int, ...]:
        if self.decode:
            return (self.kv_heads // self.herd_y,)
        return (self.kv_heads, self.rounds, self.head_passes)

    @property
    def iterations(self) -> int:
        n = 1
        for d in self.launch_grid:
            n *= d
        return n

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
    def qcycle(self) -> int:
        """Prefill: cores whose 8-row query blocks interleave (block i of core x is the round's block x + i * herd_x):
        each K/V tile then meets nearly the same number of computing row blocks on every core (causal balance)."""
        return 1 if self.decode else self.herd_x

    @property
    def q_items(self) -> int:
        """Prefill: items carrying the Q stream (the round's herd_x * lq rows of each of the herd_y heads, head-major,
        2 lk rows per item), plus one pad item (a copy of the first, which no core keeps) when that count +
        kv_tiles would be odd: the item loops then have an even trip count, so aircc's ping-pong transform makes
        two copies of their buffers, not three (mlir-air's unroll epilogue; PR #2000 later refuses odd trip
        counts)."""
        if self.decode:
            return 0
        n = self.herd_y * self.q_items_per_head
        return n + (n + self.kv_tiles) % 2

    @property
    def q_items_per_head(self) -> int:
        """Prefill: items of one head's rows in the Q stream: herd_x * lq / (2 lk), or 1 when herd_x * lq == lk (the
        item's second half then repeats the first, which no core keeps)."""
        return max(1, self.herd_x * self.lq // (2 * self.lk))

    @property
    def steps(self) -> int:
        """Trips of the item loops (segment and herd): prefill Q items + K/V tiles, decode K/V tiles."""
        return self.q_items + self.kv_tiles

    @property
    def item_copies(self) -> int:
        """Copies of the item buffers (L1 and L2) under the ping-pong transform: 1 for one trip, 2 for an
        even trip count, 3 for an odd one (kernel_builder.hw.analyze counts the same)."""
        return 1 if self.steps == 1 else (3 if self.steps % 2 else 2)

    @property
    def q_tasks(self) -> int:
        """Decode: shim DMA tasks of one split's query rows per launch: one when the rows are contiguous (one kv
        head per launch iteration, or one query head per kv head), else the tiles' parts below 64 per iteration
        (kernel_builder.hw.dma.shim_fold)."""
        if not self.decode or self.herd_y == 1 or self.group == 1 or self.kv_tiles < NPU2.bd_max_repeat:
            return 1 if self.decode and (self.herd_y == 1 or self.group == 1) else self.iterations
        part = max(f for f in range(1, NPU2.bd_max_repeat) if self.kv_tiles % f == 0)
        return -(-self.kv_tiles // part) * self.iterations

    @property
    def share(self) -> int:
        """KV positions one core streams per launch iteration (decode: a split of the window; prefill: the
        window)."""
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
        return self.herd_x * self.herd_y + (self.herd_y if self.decode else 0)

    def l1_buffers(self) -> dict[str, int]:
        """Per core tile (the item buffer with its ping-pong copies)."""
        hd = self.head_dim
        out = {"items": self.item_copies * BF16 * self.item_rows * hd, "state": F32 * self.state_floats, "pos": 4}
        if not self.decode:
            out["q_out"] = BF16 * self.lq * hd   # the core's Q tile, then its output tile
            # attention.cc's static prefill scratch: scores f32 [8][lk], probabilities bf16 [8][lk], the 8-row
            # statistics and alpha / 1/l vectors, the reduction tree's level-1 vectors [4][16] f32 (beyond the
            # planner's stack reserve)
            out["scratch"] = 48 * self.lk + 1120 + F32 * _round_up(self.lq, 16) + F32 * 4 * 16
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
        out = {}
        if self.decode:
            for x in range(self.herd_x):   # per split: its item buffer [K; V; q] for herd_y kv heads (ping-pong)
                out[f"items{x}"] = self.item_copies * BF16 * self.item_rows * self.herd_y * hd
            for y in range(self.herd_y):   # per kv head: its herd_x partials
                out[f"partials{y}"] = F32 * self.herd_x * self.state_floats
        else:
            out["items"] = self.item_copies * BF16 * self.item_rows * hd
            for x in range(self.herd_x):   # per query block: the herd_y output tiles side by side
                out[f"out{x}"] = BF16 * self.lq * self.herd_y * hd
        return out

    def l2_bytes(self) -> int:
        return sum(self.l2_buffers().values())

    def channels(self) -> dict[str, int]:
        """DMA streams of one launch by endpoint (the budget docs/kernels.md tabulates): shim MM2S/S2MM (DDR
        reads/writes), memory-tile S2MM/MM2S (into/out of L2, totals), and per core tile S2MM/MM2S."""
        x, y = self.herd_x, self.herd_y
        if self.decode:   # pos (L3 -> cores); per split: K, V, q DMAs in and y puts out; per kv head: x partials
            # in, one put to its merge core
            return {"shim_mm2s": 3 * x + 1, "shim_s2mm": y, "memtile_s2mm": 3 * x + x * y,
                    "memtile_mm2s": x * y + y, "core_s2mm": 2, "core_mm2s": 1}
        # pos (L3 -> cores); the two feed channels (Q tiles, then K / V) into the item buffer, one broadcast put
        # out; per query block x the herd_y output tiles in and one DMA to L3
        return {"shim_mm2s": 3, "shim_s2mm": x, "memtile_s2mm": 2 + x * y, "memtile_mm2s": 1 + x,
                "core_s2mm": 2, "core_mm2s": 1}

    def core_bds(self) -> int:
        """BDs per core tile: pos (1) + the ping-ponged item buffer (2) + the output / partial (1)."""
        return 4

    # ---- modeled work (what the kernel computes; the same rule as kernel_builder.external_costs)
    def _core_blocks(self, rd: int, x: int, t: int) -> int:
        """Row blocks core x computes against K/V tile t in round rd, with the chunk at the last position its
        window allows (pos = kv_rows - rows: the most work)."""
        q0 = self.kv_rows - self.rows + rd * self.herd_x * self.lq + ATTN_ROW_BLOCK * x
        return attn_prefill_blocks(self.lq, self.lk, q0, t * self.lk, self.window, self.qcycle)

    def busiest_blocks(self) -> int:
        """Prefill: the (8 query rows x lk keys) blocks charged to the herd over the launch: all cores share the
        broadcast item stream, which moves at the pace of its slowest consumer, so each K/V item costs the core
        with the most computing row blocks on it - summed over the items, rounds, kv heads and head passes. A tile
        past every query of a core's tile is skipped, and inside a computed tile an 8-row block that sees none of
        its keys (attention.cc)."""
        if self.decode:
            return self.iterations * self.kv_tiles * _round_up(self.lq, DECODE_ROW_BLOCK) // DECODE_ROW_BLOCK
        total = sum(max(self._core_blocks(rd, x, t) for x in range(self.herd_x))
                    for rd in range(self.rounds) for t in range(self.kv_tiles))
        return total * self.kv_heads * self.head_passes

    def balance(self) -> float:
        """Prefill: busiest_blocks over the blocks a core computes on average (1.0: every core equally busy on
        every item)."""
        if self.decode:
            return 1.0
        mean = sum(self._core_blocks(rd, x, t) for x in range(self.herd_x) for rd in range(self.rounds)
                   for t in range(self.kv_tiles)) / self.herd_x * self.kv_heads * self.head_passes
        return self.busiest_blocks() / mean if mean else 1.0


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
    ch = p.channels()
    return (p.l1_bytes() <= L1_BUDGET and all(b <= MEMTILE_BYTES for b in p.l2_buffers().values())
            and p.l2_bytes() <= L2_BUDGET and ch["shim_mm2s"] <= SHIM_MM2S and ch["shim_s2mm"] <= SHIM_S2MM
            and p.cores <= N_CORES)


def _decode_plans(args, group: int, window: int = 0):
    rows, kv_rows, heads, kv_heads, hd = args
    # herd_x splits of the window: a split's K, V and q DMAs are one shim stream each (3 per split + pos within
    # the shim's 16 MM2S); herd_y kv heads side by side, each with its merge core (herd_x * herd_y + herd_y
    # cores); a split's item buffer takes 3 streams in and herd_y out: herd_y = 3 would give it as many puts as
    # gets, which air-split-l2-memref splits (AIRMiscPasses.cpp, "MIMO"), so herd_y is 1, 2 or 4
    for herd_x in (8, 4, 2, 1):
        if kv_rows % (herd_x * ATTN_LK_MULTIPLE) or 3 * herd_x + 1 > SHIM_MM2S:
            continue
        for herd_y in (4, 2, 1):
            # one memory tile per L2 buffer (herd_x items + herd_y partials): air-to-aie placed a ninth buffer
            # (split 0's item with a kv head's partials: 3 + 4 streams) on one memory tile, over its 6 S2MM
            # channels, and routing failed (docs/kernels.md "attention", real lowering)
            if kv_heads % herd_y or herd_x * herd_y + herd_y > N_CORES or herd_x > MEMTILE_CHANNELS \
                    or herd_x + herd_y > NPU2_MEMTILES:
                continue
            for lk in ATTN_DECODE_LK:
                if (kv_rows // herd_x) % lk == 0 and kv_rows // herd_x // lk <= DECODE_MAX_TILES:
                    p = AttentionPlan(*args, lq=group, lk=lk, herd_x=herd_x, herd_y=herd_y, window=window)
                    if not query_rows_split(herd_y, group, p.kv_tiles):
                        yield p


def _prefill_plans(args, group: int, window: int = 0):
    rows, kv_rows, heads, kv_heads, hd = args
    herd_y = next(d for d in divisors_desc(group, NPU2_ROWS))
    for lq in divisors_desc(rows, ATTN_MAX_LQ):
        if lq % ATTN_LQ_MULTIPLE:
            continue
        for lk in ATTN_PREFILL_LK:
            if kv_rows % lk or not lk <= lq <= 2 * lk:
                continue
            # query blocks side by side (all cores share the one item stream; one output buffer per block); the
            # round's Q rows of a head fill whole items (the Q stream's puts stay one 4-d pattern per feed)
            for herd_x in divisors_desc(rows // lq, NPU2_COLS):
                if herd_y > MEMTILE_CHANNELS or ((herd_x * lq) % (2 * lk) and herd_x * lq != lk):
                    continue
                yield AttentionPlan(*args, lq=lq, lk=lk, herd_x=herd_x, herd_y=herd_y, window=window)


@functools.lru_cache(maxsize=None)
def _prefill_cycles(hd: int, lk: int) -> tuple[float, float]:
    """Counted cycles (kernel_builder.hw.cost) of one fully visible 8-row block and of an item's fixed work (the
    V blocks' transposes) of attention.cc's prefill path."""
    block = cost.compute_cycles(ac._row_block8(hd, lk, (lk,) * ATTN_ROW_BLOCK))
    return block, cost.compute_cycles(ac.prefill_item(hd, ATTN_ROW_BLOCK, lk, 1, 1, 0, 2 * lk)) - block


def _work_key(p: AttentionPlan) -> tuple:
    """Preference among fitting plans: most cores, then the least counted compute of the item stream (each item
    costs its busiest core: busiest_blocks full blocks, plus every K/V item's fixed work), then the fewest
    items."""
    block, fixed = _prefill_cycles(p.head_dim, p.lk)
    stream = p.rounds * p.kv_tiles * p.kv_heads * p.head_passes
    return (p.cores, -(p.busiest_blocks() * block + stream * fixed), -p.iterations * p.steps)


def plan_attention(rows: int, kv_rows: int, heads: int, kv_heads: int, head_dim: int,
                   window: int | None = None) -> AttentionPlan:
    """Tiling of causal GQA attention of `rows` query rows over a `kv_rows` KV window (rows == 1: decode);
    `window` (None: full causal) a sliding window of keys per query (the same data movement; the cores skip
    the compute of the tiles before it)."""
    _attention_checks(rows, kv_rows, heads, kv_heads, head_dim)
    if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window <= 0):
        raise ValueError(f"attention: window={window!r} must be a positive integer (None: full causal)")
    args = (rows, kv_rows, heads, kv_heads, head_dim)
    group = heads // kv_heads
    plans = _decode_plans(args, group, window or 0) if rows == 1 else _prefill_plans(args, group, window or 0)
    fits = [p for p in plans if _attention_fits(p)]
    if rows == 1 and fits:   # decode: the most K/V streams (splits), then an even (or single) step count (two
        # ping-pong copies, not three), then the most kv heads side by side, then big tiles
        return max(fits, key=lambda p: (p.herd_x, p.item_copies < 3, p.herd_y, p.lk))
    if fits:
        return max(fits, key=_work_key)
    what = "decode" if rows == 1 else f"prefill (query tiles must divide rows={rows} in multiples of " \
                                      f"{ATTN_LQ_MULTIPLE})"
    tiles = (f", {DECODE_MAX_TILES} K/V tiles per split (the query rows' DMA task repeat count), "
             f"query rows read without a DMA split") if rows == 1 else ""
    raise ValueError(f"attention: no {what} tiling of rows={rows}, kv_rows={kv_rows}, head_dim={head_dim} fits "
                     f"{kib(L1_BUDGET)} of L1 per tile, one {kib(MEMTILE_BYTES)} memory tile per L2 buffer{tiles} and "
                     f"{SHIM_MM2S} shim MM2S channels")
