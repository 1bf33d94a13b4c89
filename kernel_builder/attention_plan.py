"""The `attention` kernel's tiling plan (kernel_builder/kernels/attention.py): causal GQA attention of a
prefill chunk (rows > 1) or a decode row (rows == 1) over a KV window.

`plan_attention(rows, kv_rows, heads, kv_heads, head_dim)` returns the `AttentionPlan` with the most busy
cores, then the biggest tiles, within L1 (with the ping-pong copy of the item buffer), one memory tile per
L2 buffer and the shim's DMA channels, or raises ValueError naming the shape (docs/kernels.md "attention").
The NPU2 limits it shares with the other plans come from kernel_builder.planner.
"""
from __future__ import annotations

from dataclasses import dataclass

from .planner import (ATTN_HEAD_DIM_MULTIPLE, BF16, F32, L1_BUDGET, L2_BUDGET, MEMTILE_BYTES, NPU2_COLS,
                      NPU2_ROWS, _divisors_desc, _herd, _kib, check_positive)

ATTN_LK_MULTIPLE = 16         # keys per K/V tile: whole 16-lane softmax vectors
ATTN_LQ_MULTIPLE = 8          # prefill query rows per tile: whole 8-row bf16 mmul blocks (AIE2P mmul<8, 8, 4>)
ATTN_MAX_LQ = 64              # prefill query rows per tile considered
ATTN_PREFILL_LK = (32, 16)    # prefill K/V tile lengths considered (largest first)
ATTN_DECODE_LK = (64, 32, 16)  # decode K/V tile lengths considered (largest first)
SHIM_MM2S = 2 * NPU2_COLS     # shim DMA channels of the array: 2 MM2S + 2 S2MM per column
SHIM_S2MM = 2 * NPU2_COLS


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
        """Prefill: items carrying a group's Q tiles (one per core of the group), plus one pad item (a copy of
        the first, which no core keeps) when herd_y + kv_tiles would be odd: the item loops then have an even
        trip count, so aircc's ping-pong transform makes two copies of their buffers, not three (mlir-air's
        unroll epilogue; PR #2000 later refuses odd trip counts: designs.md 6)."""
        if self.decode:
            return 0
        return self.herd_y + (self.herd_y + self.kv_tiles) % 2

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
        """Per core tile (the item buffer with its ping-pong copies)."""
        hd = self.head_dim
        out = {"items": self.item_copies * BF16 * self.item_rows * hd, "state": F32 * self.state_floats, "pos": 4}
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
                out[f"kv{x}"] = self.item_copies * BF16 * self.item_rows * hd
            out["partials"] = F32 * self.herd_x * self.state_floats
        else:
            for x in range(self.herd_x):   # per group: its item buffer (ping-pong)
                out[f"items{x}"] = self.item_copies * BF16 * self.item_rows * hd
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
            fits = [p for lk in ATTN_DECODE_LK if (kv_rows // herd_x) % lk == 0
                    for p in (AttentionPlan(*args, lq=group, lk=lk, herd_x=herd_x, herd_y=1),) if _attention_fits(p)]
            if fits:   # an even (or single) step count first (two ping-pong copies, not three), then big tiles
                return max(fits, key=lambda p: (p.item_copies < 3, p.lk))
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
