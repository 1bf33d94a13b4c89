"""Which memory tile each L2 buffer lands on, as air-to-aie places them (mlir-air efeb41ce4,
mlir/lib/Conversion/AIRToAIEPass.cpp, function `L2MemrefToMemTileMap`, called by `allocL2Buffers`):

1. buckets: the L2 allocations in allocation (walk) order, an allocation joining the first bucket holding one that
   uses the same (specialised) channel - so the ping-pong copies of one buffer, whose transfers share a channel,
   stay together;
2. round robin: bucket b goes to memory tile b mod N (N = the segment's columns), whatever its bytes or streams;
3. column affinity: a bucket whose channels reach cores of ONE column only has that column as its affinity.
   Repeatedly (restarting after each swap), the first bucket i off its affinity tile swaps with the first
   bucket j on that tile which is not on its own affinity tile, when both tiles keep their remaining bytes
   >= 0 by the pass's arithmetic (free bytes counted from the round robin, which itself checks none; a swap
   credits i's tile size(j) - size(i), as the code does). Swaps keep every tile's bucket count.

This module only computes the placement; kernel_builder.hw.flows checks each tile's streams, BDs and bytes and the
GEMM planner (kernel_builder.gemm.plan) asks it for its closed-form buckets."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Bucket:
    name: str
    nbytes: int                          # all its allocations (ping-pong copies included)
    affinity: int | None = None          # the one core column its channels reach, or None
    load: dict = field(default_factory=dict)   # s2mm / mm2s / bds / bytes, summed per tile by the caller


def affinity(columns) -> int | None:
    """The affinity column of a bucket whose channels reach cores in `columns` (None unless exactly one)."""
    cols = set(columns)
    return cols.pop() if len(cols) == 1 else None


def place(buckets: list[Bucket], n_tiles: int, tile_bytes: int) -> list[int]:
    """The memory tile index (column - segment's first column) of each bucket, in the order given (the
    allocation order of each bucket's first allocation)."""
    if not buckets or n_tiles <= 0:
        return []
    where = [b % n_tiles for b in range(len(buckets))]
    free = [tile_bytes] * n_tiles
    for b, t in zip(buckets, where):
        free[t] -= b.nbytes

    def home(i: int) -> bool:
        a = buckets[i].affinity
        return a is not None and a < n_tiles and where[i] == a

    changed = True
    while changed:
        changed = False
        for i, bi in enumerate(buckets):
            if bi.affinity is None or bi.affinity >= n_tiles or home(i):
                continue
            target = bi.affinity
            for j, bj in enumerate(buckets):
                if i == j or where[j] != target or home(j):
                    continue
                ti, tj = where[i], where[j]
                # the pass's own arithmetic: i's tile is credited size(j) - size(i), j's tile the opposite
                # (the sign of a move; kept as the tool computes it, since it decides which swaps happen)
                if free[ti] + bj.nbytes - bi.nbytes < 0 or free[tj] + bi.nbytes - bj.nbytes < 0:
                    continue
                free[ti] += bj.nbytes - bi.nbytes
                free[tj] += bi.nbytes - bj.nbytes
                where[i], where[j] = tj, ti
                changed = True
                break
            if changed:
                break
    return where
