"""The tiling plan of RMSNorm with its output in block float (`rmsnorm(..., out="bfp16")`): a core produces whole
72-byte blocks, i.e. 8 rows of a column range at once, and needs a row's whole sum of squares before it can
normalise any of it. Per 8-row block a tile either holds the 8 rows whole in L1 (`chunks == 1`: one DMA of x, the
sums and the normalisation on it), or streams all its blocks twice in column chunks of `chunk` columns: once for the
sums of squares (r of every row of the tile kept in L1), once to normalise and encode each [8, chunk] piece into
chunk/8 blocks (9*chunk contiguous bytes of the block row); the second pass re-reads x from L3. When the 8 rows fit L1 only in one copy (dim 2048: 32 KiB of x), the
`single` plan keeps x and w unpingponged: x crosses the shim once, but each block's DMA waits for its calls; the
`xwhole` plan keeps the 8 whole rows in one copy too but normalises them in chunks (the weight and the output per
chunk), which fits 3072 columns (48 KiB of x). The
plan is the one the cost model (kernel_builder.hw.cost) times fastest among those that fit L1."""
from __future__ import annotations

import math
from dataclasses import dataclass

from kernel_builder.block_float import BLOCK, GROUP_BYTES
from kernel_builder.external_costs import external_cost
from kernel_builder.hw import cost
from kernel_builder.hw.facts import NPU2
from kernel_builder.hw.results import Flow
from kernel_builder.planner import (BF16, F32, L1_BUDGET, NPU2_COLS, check_positive, divisors_desc, even_or_one, kib,
                                    pingpong_copies)
from kernel_builder.rmsnorm.bfp_external import SS_LANES, rmsnorm_bfp_kernel, st_elems

SHIM_DMA_PER_COL = NPU2.shim_mm2s   # MM2S (and S2MM) DMA channels of one shim tile


@dataclass(frozen=True)
class RmsnormBfpPlan:
    rows: int
    dim: int
    herd: int              # tiles [herd, 1]; tile t owns 8-row blocks [t*blocks_per_tile, (t+1)*blocks_per_tile)
    blocks_per_tile: int
    chunk: int             # columns per call (dim: the 8 rows whole in L1)
    offset: int = 0
    single: bool = False   # the 8 rows whole, x and w in one L1 copy each (not ping-ponged: they fit only so)
    xwhole: bool = False   # the 8 rows whole in one L1 copy, normalised in chunks (w and y per chunk, ping-ponged)

    @property
    def chunks(self) -> int:
        return self.dim // self.chunk

    @property
    def x_passes(self) -> int:
        """Times x crosses the shim: once when the 8 rows fit whole, else twice (sums, then normalisation)."""
        return 1 if self.chunks == 1 or self.xwhole else 2

    @property
    def kernel_blocks(self) -> int:
        """Blocks whose r the kernel keeps (its st buffer): the tile's, when the passes run over all of them."""
        return 1 if self.x_passes == 1 else self.blocks_per_tile

    @property
    def serial(self) -> bool:
        """x in one L1 copy over a loop of blocks: each block's DMA waits for its calls."""
        return (self.single or self.xwhole) and self.blocks_per_tile > 1

    def kernel(self):
        return rmsnorm_bfp_kernel(self.dim, self.chunk, self.kernel_blocks, self.offset, int(self.xwhole))

    def l1_buffers(self) -> dict[str, int]:
        """Bytes of each L1 buffer: x and the weight chunk (ping-ponged in their loop), the state (sums of squares
        and r) and the chunk's output (one copy each: the calls write them)."""
        copies = 1 if self.single else pingpong_copies(self.blocks_per_tile if self.chunks == 1 else self.chunks)
        if self.xwhole:
            return {"x": BF16 * BLOCK * self.dim, "w": copies * BF16 * self.chunk, "st": F32 * st_elems(1),
                    "y": GROUP_BYTES * self.chunk}
        return {"x": copies * BF16 * BLOCK * self.chunk, "w": copies * BF16 * self.chunk,
                "st": F32 * st_elems(self.kernel_blocks), "y": GROUP_BYTES * self.chunk}

    def l1_bytes(self) -> int:
        return sum(self.l1_buffers().values())

    def tile_counts(self) -> dict:
        """Instruction counts of one tile's calls as the cost descriptor counts them, plus one "calls" each and
        their scalar ops (as the analyzer adds them): per block and chunk one phase-0 call (the first chunk loads
        no carried sums, the last one finishes r) and one phase-1 call."""
        desc, match = external_cost(self.kernel().symbol)
        n, k = self.blocks_per_tile, self.chunks
        if self.xwhole:      # phase 1 only: the first chunk's call sums the whole rows
            calls = [(n, 1, 0), (n * (k - 1), 1, self.chunk)]
        else:
            calls = [(n, 0, 0), (n * (k - 2), 0, self.chunk), (n * k, 1, 0)]
            if k > 1:
                calls.append((n, 0, self.dim - self.chunk))
        out: dict = {}
        for trips, phase, c0 in calls:
            w = desc.work(match, [None] * 5 + [phase, None, c0])
            for kind, v in list(w.counts.items()) + [("calls", 1), ("scalar_ops", w.scalar_ops)]:
                if v and trips > 0:
                    out[kind] = out.get(kind, 0) + trips * v
        return out

    def x_stream_bytes(self) -> int:
        """Bytes of x one tile receives (each pass): its busiest L1 stream."""
        return self.x_passes * BF16 * BLOCK * self.dim * self.blocks_per_tile

    def flows(self) -> list[Flow]:
        """The shim streams as the hardware model places them (kernel_builder.hw.flows: packed two per shim column
        in program order): the weight once into L2, then each tile's x (both passes on one stream, a DMA task per
        pass), and each tile's y (both passes when chunked: phase 0 stores zeros, phase 1 the values)."""
        y = self.x_passes * GROUP_BYTES * self.dim * self.blocks_per_tile   # chunked: zeros, then the values
        tasks = self.x_passes
        out = [Flow("MM2S", 0, "w", BF16 * self.dim, 1, 1, column=0)]
        out += [Flow("MM2S", t + 1, "x", self.x_stream_bytes(), tasks, 1, column=(t + 1) // SHIM_DMA_PER_COL)
                for t in range(self.herd)]
        out += [Flow("S2MM", t, "y", y, 1, 1, column=t // SHIM_DMA_PER_COL) for t in range(self.herd)]
        return out


def modeled_seconds(p: RmsnormBfpPlan, params: cost.CostParams = cost.PARAMS) -> float:
    """The cost model's charge of this plan in closed form (the analyzer's, without the launch overhead): the
    busiest tile's counted calls against the shim streams and the tile's x stream into L1. A `single` plan's next
    x DMA waits for the block's calls (one L1 copy): its compute adds to the streams instead of hiding under them
    (the analyzer, which takes the larger of the two, does not see that)."""
    compute = cost.compute_cycles(p.tile_counts(), params) / params.clock_hz
    l1 = max(p.x_stream_bytes(), p.x_passes * GROUP_BYTES * p.dim * p.blocks_per_tile) / params.l2_l1_bytes_per_s
    dma = max(cost.shim_seconds(p.flows(), params), l1)
    return dma + compute if p.serial else max(compute, dma)


def plan_rmsnorm_bfp(rows: int, dim: int, offset: int = 0) -> RmsnormBfpPlan:
    check_positive("rmsnorm", rows=rows, dim=dim)
    if rows % BLOCK:
        raise ValueError(f"rmsnorm: out='bfp16' needs rows to be a multiple of {BLOCK} (8-row blocks of the block-float "
                         f"output), got rows={rows}")
    if dim % SS_LANES:
        raise ValueError(f"rmsnorm: dim={dim} must be a multiple of {SS_LANES} (32-lane bf16 vector path)")
    blocks = rows // BLOCK
    herd = divisors_desc(blocks, NPU2_COLS)[0]
    best, best_key = None, None
    for chunk in divisors_desc(dim, dim):
        # a chunk's run of a row is one shim BD dimension: over NPU2.air_dma_max_size elements mlir-air splits it
        # (one dimension more), the block loop is then unrolled into BDs and the real lowering runs out of them
        # ("Allocator exhausted available buffer descriptor IDs" with 1024-column chunks at 1024-2048 rows)
        if chunk % SS_LANES or (chunk < dim and chunk > NPU2.air_dma_max_size):
            continue
        modes = [(False, False)] + ([(True, False)] if chunk == dim and blocks > herd else []) \
            + ([(False, True)] if chunk < dim else [])
        for single, xwhole in modes:
            p = RmsnormBfpPlan(rows, dim, herd, blocks // herd, chunk, offset, single, xwhole)
            if p.l1_bytes() > L1_BUDGET:
                continue
            trips = 1 if single else p.blocks_per_tile if p.chunks == 1 else p.chunks   # the ping-ponged loop
            # prefer: a safe ping-pong trip count, the least modeled time (0.1 %), then the bigger chunk, then
            # ping-ponged x
            key = (even_or_one(trips), -round(math.log(modeled_seconds(p)) * 1000), chunk, not p.serial)
            if best_key is None or key > best_key:
                best, best_key = p, key
    if best is None:
        need = RmsnormBfpPlan(rows, dim, herd, blocks // herd, SS_LANES, offset).l1_bytes()
        raise ValueError(f"rmsnorm: dim={dim} with a block-float output needs {kib(need)} of L1 per tile; "
                         f"the NPU2 limit is {kib(L1_BUDGET)}")
    return best
