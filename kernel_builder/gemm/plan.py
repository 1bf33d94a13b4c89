"""The GEMM's tiling plan: c[m, n] = a[m, k] @ w[n, k]^T on the 8x4 herd (kernel_builder/gemm/builder.py).

`plan_gemm(m, k, n, epilogue)` returns the `GemmPlan` the hardware model's cost model times fastest (`modeled_seconds`: the
busiest tile's micro-kernel calls, the shim columns' DDR streams in the allocator's order, the L2 -> L1 streams),
then the most busy tiles, then the deepest tile_k (fewer accumulator loads and stores per MAC in the
micro-kernel), then the fewest bytes streamed into a tile per MAC, then the most MACs per tile, with the deepest
L2 panel that still fits; or raises ValueError naming the limit. "Fits" = L1 with the ping-pong copies aircc
makes, the memory tiles (bytes, DMA channels, BDs), the shim channels and the shim stride of the folded W load
(docs/kernels.md "gemm"; where BN*k rows exceed that stride, `spread` gives each herd column a contiguous quarter of
the output columns so the launch steps through W tile_n rows at a time). The NPU2 limits it shares with the other plans come from kernel_builder.planner.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from fractions import Fraction

from kernel_builder.external_costs import call_counts
from kernel_builder.block_float import BLOCK_BYTES as BFP_BLOCK_BYTES
from kernel_builder.gemm.external import (C_FORMATS, GEMM_M_MULTIPLE, GEMM_N_MULTIPLE, W_FORMATS, c_epilogue, gemm_kernels,
                                          scratch_elems)
import kernel_builder.gemm.a_bfp as a_bfp
from kernel_builder.hw import cost, memtile_place
from kernel_builder.hw.facts import NPU2
from kernel_builder.hw.results import Flow
from kernel_builder.planner import (BF16, F32, L1_BUDGET, MEMTILE_BYTES, MMUL_K, MMUL_M, MMUL_N, N_MEMTILES, NPU2_COLS,
                                    NPU2_ROWS, check_positive, kib, widest_herd)

MAX_GEMM_TILE = 128           # largest L1 GEMM tile edge considered
EPILOGUES = ("none", "swiglu", "bias")   # what the tile's epilogue does (external_kernels/gemm.cc out / glu / bias)
# A resident in L2 (GemmPlan.a_resident): A read from DDR once instead of n / bn_out times; the planner takes it
# where the cost model times it faster (2048x2048x8192: 11.5 instead of 15.3 ms). Its module (pre-blocked L2 panels,
# W streamed from the launch in one flat panel loop: gemm/builder.py) lowers with the real tool in seconds
A_RESIDENT = True
BLOCK_ROWS = MMUL_M           # rows of one 8x8 block of the pre-blocked L2 panels (gemm/builder.py)
MAX_GEMM_L2_K = 512           # deepest L2 GEMM panel considered (mlir-air's registry uses tile_k_l2 256/512)
MEMTILE_DMA_CHANNELS = NPU2.memtile_s2mm  # S2MM (and MM2S) DMA channels of one memory tile
SHIM_DMA_PER_COL = NPU2.shim_mm2s  # MM2S (and S2MM) DMA channels of one shim tile
MEMTILE_BDS = NPU2.memtile_bds     # BDs of one memory tile, 24 for its even and 24 for its odd channels
MAX_GEMM_PUT_BDS = 16         # BDs one panel broadcast may take: leaves 8 of its channel group's 24 to the
                              # group's other channels (observed: 24 for one put + 6 others failed aiecc's
                              # aie-assign-bd-ids on the 64x1536x576 GEMM)
# a shim BD stride is a 20-bit count of 32-bit words: 1048576 words = 2097152 bf16 elements
SHIM_MAX_STRIDE_BF16 = NPU2.shim_bd_max_stride * (NPU2.transfer_granularity_bytes // BF16)


@dataclass(frozen=True)
class GemmPlan:
    """c = a @ w^T with w in the HF [n, k] layout. A launch point owns a [BM, BN] output block
    (BM = herd_m*tile_m, BN = herd_n*tile_n); every herd tile owns one [tile_m, tile_n] tile for the whole K
    reduction (f32 accumulator in L1). Per L2 K step (tile_k_l2) the segment stages, split per memory tile,
    one A row panel [tile_m, tile_k_l2] per herd row and one W panel [tile_n, tile_k_l2] per herd column,
    and broadcasts their [*, tile_k] slices, re-blocked to 8x8, to the herd's rows / columns; each tile
    drains its bf16 tile into its herd row's L2 C panel [tile_m, BN], which leaves with one DMA."""

    tile_m: int      # output rows per compute tile (L1)
    tile_k: int      # K depth of one micro-kernel call (L1 A/W tiles)
    tile_n: int      # output cols per compute tile (L1)
    herd_m: int      # herd extent over M (columns of the array)
    herd_n: int      # herd extent over N (rows of the array)
    tile_k_l2: int = 0   # K depth of one L2 panel (a multiple of tile_k); 0 = tile_k
    k: int = 0           # the reduction length (0: unknown, ping-pong budgeted as two copies)
    w_parts: int = 1     # L3 -> L2 loads (shim streams) filling a herd column's W panel, one per row part
    epilogue: str = "none"   # EPILOGUES: "swiglu" = one weight, gate and up rows interleaved by 8
    spread: bool = False     # herd column j owns the output columns [j*n/herd_n, (j+1)*n/herd_n), the launch
                             # steps through them out_n at a time (its W stride: out_n rows, not bn_out)
    a_resident: bool = field(default=False, kw_only=True)   # one launch point per BM rows: each herd row's whole [tile_m, k] A panel stays in L2
                              # while the segment loops over the column blocks (A read from DDR once)
    w_format: str = field(default="bf16", kw_only=True)   # W_FORMATS: "bfp16" = W at rest in block float (gemm_bfp:
                              # 72 bytes per 8x8 block instead of 128, kernel_builder/block_float.py)
    a_format: str = field(default="bf16", kw_only=True)   # A_FORMATS: "bfp16" = A at rest in block float too (i8
                              # [m/8, 9k], the weights' layout): no in-core conversion, no scratch (gemm/a_bfp.py)
    c_format: str = field(default="bf16", kw_only=True)   # C_FORMATS: "bfp16" = C written in block float, i8
                              # [m/8, 9n] (external_kernels/gemm_c_bfp.h, gemm/c_bfp.py; needs W in block float, no bias)

    def __post_init__(self) -> None:
        if not self.tile_k_l2:
            object.__setattr__(self, "tile_k_l2", self.tile_k)
        if self.tile_k_l2 % self.tile_k:
            raise ValueError(f"gemm plan: tile_k_l2={self.tile_k_l2} is not a multiple of tile_k={self.tile_k}")
        if self.epilogue not in EPILOGUES:
            raise ValueError(f"gemm plan: unknown epilogue {self.epilogue!r} (known: {', '.join(EPILOGUES)})")
        if self.tile_n % (8 * self.w_parts):
            raise ValueError(f"gemm plan: tile_n={self.tile_n} does not split into {self.w_parts} 8-row W parts")
        if self.a_resident and (not self.k or self.spread or self.w_parts != 1 or self.epilogue == "bias"):
            raise ValueError("gemm plan: a resident A panel needs k, one W part, no spread and no bias")
        if self.w_format not in W_FORMATS:
            raise ValueError(f"gemm plan: unknown W format {self.w_format!r} (known: {', '.join(W_FORMATS)})")
        a_bfp.check_format(self.a_format, self.w_format)
        _check_c_format(self)

    @property
    def w_block_bytes(self) -> int:
        """Bytes of one 8x8 W block: 128 in bf16, 72 in block float (bfp16ebs8: 8 rows x [E, m0 .. m7])."""
        return BFP_BLOCK_BYTES if self.w_format == "bfp16" else BF16 * BLOCK_ROWS * BLOCK_ROWS

    def w_bytes(self, rows: int, cols: int) -> int:
        """Bytes of [rows, cols] of W in its format (whole 8x8 blocks)."""
        return rows * cols * self.w_block_bytes // (BLOCK_ROWS * BLOCK_ROWS)

    def c_bytes(self, rows: int, cols: int) -> int:
        """Bytes of [rows, cols] of C in its format: bf16, or block float (72 bytes per 8x8 block)."""
        return rows * cols * BFP_BLOCK_BYTES // 64 if self.c_format == "bfp16" else BF16 * rows * cols

    @property
    def a_block_bytes(self) -> int:
        """Bytes of one 8x8 A block: 128 in bf16, 72 in block float."""
        return BFP_BLOCK_BYTES if self.a_format == "bfp16" else BF16 * BLOCK_ROWS * BLOCK_ROWS

    def a_bytes(self, rows: int, cols: int) -> int:
        """Bytes of [rows, cols] of A in its format (whole 8x8 blocks)."""
        return rows * cols * self.a_block_bytes // (BLOCK_ROWS * BLOCK_ROWS)

    @property
    def out_n(self) -> int:
        """Output columns of one compute tile (the swiglu epilogue halves the tile: gate and up columns)."""
        return self.tile_n // 2 if self.epilogue == "swiglu" else self.tile_n

    @property
    def bn_out(self) -> int:
        """Output columns of one launch point."""
        return self.herd_n * self.out_n

    def launch_n(self) -> int:
        """Output columns between consecutive launch points along n (the W panel loads' launch stride in rows)."""
        return self.out_n if self.spread else self.bn_out

    @property
    def w_per_out(self) -> int:
        """W rows per output column: 2 with the swiglu epilogue (gate and up interleaved by 8 rows in one weight,
        kernel_builder/gemm_swiglu/layout.py), else 1."""
        return 2 if self.epilogue == "swiglu" else 1

    @property
    def part_rows(self) -> int:
        return self.tile_n // self.w_parts

    def copies(self, step: int) -> int:
        """Copies aircc's ping-pong transform makes of a buffer allocated in a K loop of `step`: 1 for a single
        trip, 2, or 3 for an odd trip count (the remainder iteration gets its own buffers in the mlir-air the
        lowering toolchain builds; kernel_builder.hw.analyze.pingpong_copies)."""
        trips = self.k // step if self.k else 2
        return 1 if trips == 1 else (3 if trips % 2 else 2)

    @property
    def bm(self) -> int:
        return self.herd_m * self.tile_m

    @property
    def bn(self) -> int:
        return self.herd_n * self.tile_n

    def l1_buffers(self) -> dict[str, int]:
        """The f32 accumulator (the epilogue writes the bf16 tile in place over it), the ping-pong A and W tiles,
        the mac's block-float copy of the A tile and, with the bias epilogue, the tile's bias slice."""
        c = self.copies(self.tile_k)   # ping-pong copies of the tiles of the herd's K loop
        return {"acc_f32": F32 * self.tile_m * self.tile_n,
                "a_tiles": c * self.a_bytes(self.tile_m, self.tile_k),
                "w_tiles": c * self.w_bytes(self.tile_n, self.tile_k),
                "a_bfp16": 0 if self.a_format == "bfp16" else BF16 * scratch_elems(self.tile_m, self.tile_k),
                "bias": BF16 * self.tile_n if self.epilogue == "bias" else 0}

    def l1_bytes(self) -> int:
        return sum(self.l1_buffers().values())

    def l2_buffers(self) -> dict[str, int]:
        """Bytes of ONE L2 buffer of each kind (the panels with their ping-pong copies): herd_m A panels,
        herd_n x w_parts W panel parts and herd_m C row panels (and herd_n bias slices), each its own allocation
        (so each fits one memory tile)."""
        c = self.copies(self.tile_k_l2)
        a_panel = self.a_bytes(self.tile_m, self.k if self.a_resident else c * self.tile_k_l2)
        sizes = {"a_panel": a_panel,
                 "w_panel": c * self.w_bytes(self.tile_n, self.tile_k_l2),
                 "c_panel": self.c_bytes(self.tile_m, self.bn_out)}   # resident: one copy, pinned outside its drain loop
        return {**sizes, "bias": BF16 * self.tile_n} if self.epilogue == "bias" else sizes

    def l2_counts(self) -> dict[str, int]:
        counts = {"a_panel": self.herd_m, "w_panel": self.herd_n, "c_panel": self.herd_m}
        return {**counts, "bias": self.herd_n} if self.epilogue == "bias" else counts

    def l2_bytes(self) -> int:
        """All L2 bytes of one launch point (spread over the memory tiles)."""
        sizes, counts = self.l2_buffers(), self.l2_counts()
        return sum(sizes[b] * counts[b] for b in sizes)

    def memtile_bds(self) -> dict[str, int]:
        """BDs per memory-tile DMA channel: a panel broadcast needs one BD per ping-pong copy and, when its
        8x8-blocked slice pattern has four non-unit dims (no room to fold the slice loop into the BD), one per
        slice of the panel; a panel's L3 -> L2 load one per copy; each drain and the C write one."""
        if self.a_resident:   # pre-blocked panels: a slice is two dims, the slice loop folds (builder._slice)
            return {"a_put": 1, "w_put": self.copies(self.tile_k_l2), "panel_load": self.copies(self.tile_k_l2),
                    "drain": 1, "c_write": 1}

        def put(rows: int, blocked: bool = False) -> int:
            # a block-float slice (blocked: W at rest): per K chunk one run per 8-row block, <= 3 dims: it folds
            dims = 3 if blocked else sum(1 for d in (rows // 8, self.tile_k // 8, 8, 8) if d > 1)
            slices = self.tile_k_l2 // self.tile_k if dims > 3 else 1
            return self.copies(self.tile_k_l2) * slices
        return {"a_put": put(self.tile_m, self.a_format == "bfp16"), "w_put": put(self.tile_n, self.w_format == "bfp16"),
                "panel_load": self.copies(self.tile_k_l2),
                "drain": 1, "c_write": 1}

    def memtile_bd_total(self) -> int:
        """BDs on the busiest memory tile: one A and one W panel (load + broadcast), herd_n drains, one write."""
        b = self.memtile_bds()
        return b["a_put"] + b["w_put"] + 2 * b["panel_load"] + self.herd_n * b["drain"] + b["c_write"]

    def l2_order(self) -> list[tuple[str, int]]:
        """The L2 buffers of one launch point in allocation order (the builder's: the bias slices, the herd_m A
        panels, the herd_n W panels, the C row panels) as (kind, index)."""
        bias = [("bias", j) for j in range(self.herd_n if self.epilogue == "bias" else 0)]
        return (bias + [("a", i) for i in range(self.herd_m)] + [("w", j) for j in range(self.herd_n)]
                + [("c", i) for i in range(self.herd_m)])

    def memtile_placement(self) -> list[list[tuple[str, int]]]:
        """The L2 buffers on each memory tile as air-to-aie places them (kernel_builder.hw.memtile_place, mlir-air
        AIRToAIEPass.cpp L2MemrefToMemTileMap): buckets by shared channel (bias slice j rides W panel j's
        channel), round robin in allocation order, then A panel i and C row panel i (their channels reach only
        herd row i's cores, array column i) swapped onto memory tile i."""
        sizes = self.l2_buffers()
        names = {"a": "a_panel", "w": "w_panel", "c": "c_panel", "bias": "bias"}
        buckets, members, by_w = [], [], {}
        for kind, idx in self.l2_order():
            nbytes = sizes[names[kind]]
            key = idx if kind in ("w", "bias") else None
            if key is not None and key in by_w:
                b = by_w[key]
                buckets[b].nbytes += nbytes
                members[b].append((kind, idx))
                continue
            buckets.append(memtile_place.Bucket(f"{kind}{idx}", nbytes, idx if kind in ("a", "c") else None))
            members.append([(kind, idx)])
            if key is not None:
                by_w[key] = len(buckets) - 1
        tiles: list[list] = [[] for _ in range(N_MEMTILES)]
        for b, t in enumerate(memtile_place.place(buckets, N_MEMTILES, MEMTILE_BYTES)):
            tiles[t] += members[b]
        return tiles

    def memtile_bytes(self) -> int:
        """Bytes on the fullest memory tile: the larger of that placement's and the earlier bound (ceil(buffers / 8)
        of the largest buffer), which the plans checked with the real lowering were chosen under (the placement
        alone admits deeper panels at some shapes: not yet lowered)."""
        sizes = self.l2_buffers()
        names = {"a": "a_panel", "w": "w_panel", "c": "c_panel", "bias": "bias"}
        placed = max(sum(sizes[names[k]] for k, _ in t) for t in self.memtile_placement())
        if self.a_resident:
            return placed
        n = sum(self.l2_counts().values())
        return max(placed, -(-n // N_MEMTILES) * max(sizes.values()))

    def memtile_channels(self) -> tuple[int, int]:
        """(S2MM, MM2S) DMA channels of the busiest memory tile under that placement: an A panel or a bias slice
        takes one of each, a W panel w_parts S2MM (its loads) and one MM2S, a C row panel herd_n S2MM (its
        drains) and one MM2S (its write to L3)."""
        s2mm = {"c": self.herd_n, "w": self.w_parts}
        tiles = [(sum(s2mm.get(k, 1) for k, _ in t), len(t)) for t in self.memtile_placement()]
        return max(t[0] for t in tiles), max(t[1] for t in tiles)

    def channels(self) -> dict[str, int]:
        """DMA channels of one launch point. Shim: one MM2S per A panel, W panel part and bias slice, one S2MM per C
        row panel. Memory tile: the busiest under round-robin placement (memtile_channels). Core: A and W in
        (the bias slice arrives on the W channel), C out."""
        bias = self.epilogue == "bias"
        s2mm, mm2s = self.memtile_channels()
        return {"shim_mm2s": self.herd_m + self.herd_n * (self.w_parts + bias), "shim_s2mm": self.herd_m,
                "memtile_s2mm": s2mm, "memtile_mm2s": mm2s, "core_s2mm": 2, "core_mm2s": 1}

    def ddr_read_bytes(self, m: int, k: int, n: int) -> int:
        """DDR bytes read by one GEMM of n output columns: each launch block reads its A row block and W row
        block(s) once (the panels are broadcast on chip), so A is read n/bn_out times and each W m/BM times."""
        weights = 2 if self.epilogue == "swiglu" else 1
        return (self.a_bytes(m, k) * (1 if self.a_resident else n // self.bn_out)
                + self.w_bytes(weights * n, k) * (m // self.bm))


def _a_folds(p: GemmPlan, k: int, n: int) -> bool:
    """Whether the A panel load's BD stays within the shim stride once the launch grid folds into it: the output
    column dim (A's offset does not move) folds first as a repeat, and when the runtime loop tiling leaves it an
    even tile that fourth dim stops the fold before the row dim, whose stride is BM rows of a (BM * k elements);
    an odd or single column extent lets the row dim fold (kernel_builder.hw.dma.shim_fold)."""
    cols = 1 if p.a_resident else n // p.bn_out
    return p.a_bytes(p.bm, k) <= SHIM_MAX_STRIDE_BF16 * BF16 or cols % 2 == 0


def _gemm_fits(p: GemmPlan, k: int) -> bool:
    """L1, memory tiles, channels, and the shim stride: under runtime loop tiling the W panel load folds the
    launch loop over output-column blocks into its BD with a stride of BN rows of w (BN * k elements)."""
    ch = p.channels()
    bds = p.memtile_bds()
    # pre-blocked resident panels: a slice or a drain is one contiguous run of 8 rows per 8-row block, and the
    # panel writes step over k / 8 (A) and tile_k_l2 / 8 (W) blocks: dims of non-contiguous memory-tile BDs (at
    # most NPU2.bd_max_size each)
    if p.a_resident and max(BLOCK_ROWS * max(p.tile_k, p.out_n), k // BLOCK_ROWS) > NPU2.bd_max_size:
        return False
    # W at rest in block float (i8): a block row's tile_k_l2 panel row is one shim run of 9 * tile_k_l2 bytes, at
    # most NPU2.shim_bd_max_size elements (the real lowering split a 2304-byte run into 3 x 768: that dim was then
    # missing for the column-block loop of the W stream, whose BDs exhausted the shim's IDs). Its tile_k slices
    # come in K chunks of runs within NPU2.bd_max_size (gemm/external.py bfp_chunk_k).
    if p.w_format == "bfp16" and p.w_bytes(BLOCK_ROWS, p.tile_k_l2) > NPU2.shim_bd_max_size:
        return False
    if p.a_format == "bfp16" and not a_bfp.fits(p, k):   # the same rules for A in block float
        return False
    return (p.l1_bytes() <= L1_BUDGET and p.memtile_bytes() <= MEMTILE_BYTES
            and p.w_bytes(p.w_per_out * p.launch_n(), k) <= SHIM_MAX_STRIDE_BF16 * BF16
            and max(bds["a_put"], bds["w_put"]) <= MAX_GEMM_PUT_BDS and p.memtile_bd_total() <= MEMTILE_BDS
            and ch["memtile_s2mm"] <= MEMTILE_DMA_CHANNELS and ch["memtile_mm2s"] <= MEMTILE_DMA_CHANNELS
            and ch["shim_mm2s"] <= SHIM_DMA_PER_COL * NPU2_COLS and ch["shim_s2mm"] <= SHIM_DMA_PER_COL * NPU2_COLS)


def plan_gemm(m: int, k: int, n: int, epilogue: str = "none", *, resident: bool | None = None,
              w_format: str = "bf16", a_format: str = "bf16", c_format: str = "bf16") -> GemmPlan:
    """The fastest fitting plan for c[m, n] (n output columns; with the swiglu epilogue each tile computes the
    gate and the up columns of its outputs side by side: its tile_n covers tile_n/2 outputs). `resident`: whether
    A-resident plans are candidates (None: A_RESIDENT; False: the streamed plans only, as upstream designs).
    `w_format`: the W stream's format (W_FORMATS; "bfp16": kind gemm_bfp, W at rest in block float); `a_format`:
    A's (A_FORMATS; "bfp16" with W in block float: A at rest in block float too, kernel_builder/gemm/a_bfp.py).
    `c_format`: the output's (C_FORMATS; "bfp16": C written in block float, i8 [m/8, 9n])."""
    if c_format not in C_FORMATS:
        raise ValueError(f"gemm: unknown C format {c_format!r} (known: {', '.join(C_FORMATS)})")
    check_positive("gemm", m=m, k=k, n=n)
    a_bfp.check_format(a_format, w_format)
    for name, v, q in (("m", m, GEMM_M_MULTIPLE), ("k", k, MMUL_K), ("n", n, GEMM_N_MULTIPLE)):
        if v % q:
            raise ValueError(f"gemm: {name}={v} must be a multiple of {q} (AIE2P bf16 matmul micro-kernel on "
                             f"{MMUL_M}x{MMUL_K}x{MMUL_N} blocks, two column blocks per step); use gemv for "
                             f"single-row products")
    if epilogue not in EPILOGUES:
        raise ValueError(f"gemm: unknown epilogue {epilogue!r} (known: {', '.join(EPILOGUES)})")
    glu = epilogue == "swiglu"
    m_tiles = [t for t in range(MAX_GEMM_TILE, 0, -GEMM_M_MULTIPLE) if m % t == 0]
    n_tiles = [t for t in range(MAX_GEMM_TILE, 0, -GEMM_N_MULTIPLE) if n % (t // 2 if glu else t) == 0]
    best, best_key = None, None
    for tile_k in (64, 32, 16, 8):
        if k % tile_k:
            continue
        for tile_m in m_tiles:
            herd_m = widest_herd(m // tile_m, NPU2_COLS)
            for tile_n in n_tiles:
                out_n = tile_n // 2 if glu else tile_n
                # one W load per panel (the swiglu epilogue's gate and up interleaved in one weight): the real
                # lowering puts each herd row's A and C panels on its column's memory tile, 1 + herd_n S2MM, so a
                # two-load W panel finds no tile with room (aie-create-pathfinder-flows failed)
                on = A_RESIDENT if resident is None else resident
                resident_opts = (False, True) if on and epilogue != "bias" else (False,)
                for parts, spread, res in ((1, sp, r) for sp in (False, True)
                                           for r in (resident_opts if not sp else (False,))):
                    if tile_n % (8 * parts):
                        continue
                    plan = GemmPlan(tile_m, tile_k, tile_n, herd_m, widest_herd(n // out_n, NPU2_ROWS), k=k,
                                    w_parts=parts, epilogue=epilogue, spread=spread, a_resident=res,
                                    w_format=w_format, a_format=a_format, c_format=c_format)
                    if (spread and plan.herd_n == 1) or not _a_folds(plan, k, n):
                        continue
                    if not _gemm_fits(plan, k):
                        continue
                    # prefer: the least modeled time (rounded to 0.1 %: equal-cost plans tie), then more busy
                    # tiles (compute slack), then fewer DDR bytes (slack on the shim side), then deeper tile_k (one
                    # accumulator load + store per output block per K step), then fewer bytes streamed into each
                    # tile per MAC, then more MACs per tile, then fewer W parts
                    key = (-round(math.log(modeled_seconds(plan, m, k, n)) * 1000), -res, plan.herd_m * plan.herd_n,
                           -plan.ddr_read_bytes(m, k, n), tile_k, Fraction(tile_m * tile_n, tile_m + tile_n),
                           tile_m * tile_n, -parts, -spread)
                    if best_key is None or key > best_key:
                        best, best_key = plan, key
    if best is not None:
        return _deepest_l2_panel(best, k)
    raise ValueError(f"gemm: m={m}, k={k}, n={n} (epilogue {epilogue}) has no tiling whose L1 buffers (f32 "
                     f"accumulator, 2x A and 2x W bf16 tiles) fit {kib(L1_BUDGET)} per tile, whose L2 panels "
                     f"fit one {kib(MEMTILE_BYTES)} memory tile and whose W block stride fits a shim BD")


def _deepest_l2_panel(p: GemmPlan, k: int) -> GemmPlan:
    """The deepest L2 K step (a multiple of tile_k dividing k, at most MAX_GEMM_L2_K) that still fits: longer
    contiguous DDR runs per panel row (tile_k_l2 * 2 bytes) and fewer L3 DMA steps per launch point."""
    steps = k // p.tile_k
    for d in sorted((d for d in range(1, steps + 1) if steps % d == 0), reverse=True):
        if p.tile_k * d > MAX_GEMM_L2_K:
            continue
        q = dataclasses.replace(p, tile_k_l2=p.tile_k * d, k=k)
        if _gemm_fits(q, k):
            return q
    return p


def load_order(p: GemmPlan) -> list[tuple[str, int, int]]:
    """The L3 -> L2 panel loads of one L2 K step in program order: ("a", i, 0) per herd row, ("w", j, part)
    per herd column and W row part. One part: A0, W0, A1, W1, ... (the shim allocator walks the columns two
    channels at a time in program order, kernel_builder.hw.flows: each column pairs an A panel with a W panel).
    Two parts: the first half of the A panels, then each W panel's two loads, then the other A panels: each
    column streams two A panels or one W panel's two halves, and AIR's round-robin placement of the L2 buffers
    puts no W panel (two loads in) on a memory tile with an A panel and a C row panel (GemmPlan.memtile_channels)."""
    ws = [("w", j, q) for j in range(p.herd_n) for q in range(p.w_parts)]
    if p.w_parts == 1:
        loads = [("a", i, 0) for i in range(p.herd_m)]
        for t, w in enumerate(ws):
            loads.insert(2 * t + 1, w)
        return loads
    half = p.herd_m // 2
    return [("a", i, 0) for i in range(half)] + ws + [("a", i, 0) for i in range(half, p.herd_m)]


def gemm_flows(p: GemmPlan, m: int, k: int, n: int) -> list[Flow]:
    """The shim streams of the whole GEMM (n output columns) as the builder emits them: per launch point and L2
    K step the bias slices, the panel loads in load_order, and one C row panel write per herd row; one DMA task
    each (runtime loop tiling folds the launch and K loops into the BDs); packed two per shim column in program
    order. (The analyzer starts each at its memory tile's column, as the tool does - kernel_builder.hw.flows; for
    the 8-column herds both give the same busiest column. The closed form keeps the packing: following the tool here
    makes the planner prefer 4-column herds at 64-256 rows, modules not yet checked with the real lowering.)"""
    points = (m // p.bm) * (n // p.bn_out)
    a_loads = m // p.bm if p.a_resident else points    # a resident A panel is loaded once per launch point
    kinds = ["b"] * (p.herd_n if p.epilogue == "bias" else 0) + [kind for kind, _, _ in load_order(p)]
    nbytes = {"a": p.a_bytes(p.tile_m, k), "w": p.w_bytes(p.part_rows, k), "b": BF16 * p.tile_n}
    flows = [Flow("MM2S", i, kind, nbytes[kind] * (a_loads if kind == "a" else points), 1, 1,
                  column=i // SHIM_DMA_PER_COL)
             for i, kind in enumerate(kinds)]
    flows += [Flow("S2MM", i, "c", p.c_bytes(p.tile_m, p.bn_out) * points, 1, 1, column=i // SHIM_DMA_PER_COL)
              for i in range(p.herd_m)]
    return flows


def modeled_seconds(p: GemmPlan, m: int, k: int, n: int, params: cost.CostParams = cost.PARAMS) -> float:
    """What the cost model (kernel_builder.hw.cost) charges the GEMM launch of this plan, in closed form: the
    busiest tile's micro-kernel calls as the kernel's cost descriptor counts them (tile_counts), against the shim
    streams (gemm_flows) and the busiest core's busiest L2 -> L1 stream (its A or its W tiles). Without the per-launch
    overhead and the ELF factor (the same for every plan of one shape); the planner ranks plans by it."""
    points = (m // p.bm) * (n // p.bn_out)
    compute = cost.compute_cycles(tile_counts(p, k, points), params) / params.clock_hz
    # A and W arrive on the core's two S2MM channels, one stream each: the busier one, as the analyzer charges
    l1 = max(p.a_bytes(p.tile_m, k), p.w_bytes(p.tile_n, k)) * points / params.l2_l1_bytes_per_s
    return max(compute, cost.shim_seconds(gemm_flows(p, m, k, n), params), l1)


def tile_counts(p: GemmPlan, k: int, tiles: int = 1) -> dict:
    """Instruction counts (cost.ISSUE_KINDS) of `tiles` output tiles of one compute tile: per tile one zero,
    k/tile_k macs and one out call, each as the micro-kernel's cost descriptor (gemm/external.py COSTS, what the
    hardware model charges per call) counts it, plus one "calls" per call, as the analyzer adds them."""
    ks = gemm_kernels(p.tile_m, p.tile_k, p.tile_n, p.w_format, p.a_format, p.c_format)
    return call_counts(((ks.zero, 1), (ks.mac, k // p.tile_k), (c_epilogue(ks, p.epilogue, p.c_format), 1)), tiles)


def _check_c_format(p: GemmPlan) -> None:
    """C in block float: the gemm_bfp.cc object's outc / gluc (W in block float), epilogue none or swiglu."""
    if p.c_format not in C_FORMATS:
        raise ValueError(f"gemm plan: unknown C format {p.c_format!r} (known: {', '.join(C_FORMATS)})")
    if p.c_format == "bfp16" and (p.w_format != "bfp16" or p.epilogue == "bias"):
        raise ValueError("gemm plan: C in block float needs W in block float and the epilogue none or swiglu")
