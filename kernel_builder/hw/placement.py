"""Where air-to-aie puts the L2 buffers of a segment: the memory-tile placement of mlir-air's AIRToAIEPass.cpp
`L2MemrefToMemTileMap` (the commit kernel_builder/toolchain_pins.py names), as the hardware model and the GEMM
planner count it.

1. Buckets: buffers referenced by one air.channel at identical indices share a bucket (one memory tile).
2. Round-robin: the buckets, in the order of their allocations, are dealt over the memory tiles.
3. Column affinity: a bucket whose channels reach cores of ONE array column wants that column's memory tile;
   pairwise swaps move it there when the bucket on that tile is not on its own affinity tile and both tiles keep
   room for the bytes (count-neutral: each tile keeps its number of buckets, not its number of streams).

Step 3 is what decides the GEMM: each herd row's A panel (broadcast along one column) and C row panel (drained
from one column) land together on their column's memory tile, 1 + herd_n S2MM, and the column-free W panels fill
the other slots - so a W panel with two inbound loads finds a tile with 7 S2MM (seen in the real lowering:
aie-create-pathfinder-flows "targets same dst as another connect op").
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Bucket:
    """One placement unit: its bytes and its affinity column (-1: none)."""

    nbytes: int
    affinity: int = -1


def place(buckets: list[Bucket], n_tiles: int, tile_bytes: int) -> list[int]:
    """The memory tile index of each bucket (memory tile i sits in array column i)."""
    if not buckets:
        return []
    tile_of = [i % n_tiles for i in range(len(buckets))]
    free = [tile_bytes] * n_tiles
    for b, t in zip(buckets, tile_of):
        free[t] -= b.nbytes

    def on_affinity(i: int) -> bool:
        return buckets[i].affinity >= 0 and tile_of[i] == buckets[i].affinity

    changed = True
    while changed:
        changed = False
        for i, b in enumerate(buckets):
            if b.affinity < 0 or on_affinity(i) or b.affinity >= n_tiles:
                continue
            target = b.affinity
            for j in range(len(buckets)):
                if i == j or tile_of[j] != target or on_affinity(j):
                    continue
                ti, tj = tile_of[i], tile_of[j]
                delta = buckets[j].nbytes - b.nbytes   # the pass's own arithmetic on its free-bytes map, as it is
                if free[ti] + delta < 0 or free[tj] - delta < 0:
                    continue
                free[ti] += delta
                free[tj] -= delta
                tile_of[i], tile_of[j] = tj, ti
                changed = True
                break
            if changed:
                break
    return tile_of


def channel_columns(size: tuple[int, ...], broadcast: tuple[int, ...] | None, index: tuple[int, ...]) -> set[int]:
    """The herd x coordinates (array columns, the herd placed from column 0) a segment-side put or get at `index`
    on a channel of `size` / `broadcast` shape reaches: a dim of size 1 broadcast over b tiles reaches all b."""
    if not index:
        return set()
    shape = tuple(broadcast) if broadcast else tuple(size)
    s0, b0 = (size[0] if size else 1), (shape[0] if shape else 1)
    if s0 == 1 and b0 > 1:
        return set(range(b0))
    return {index[0]}
