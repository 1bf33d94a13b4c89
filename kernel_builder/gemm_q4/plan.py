"""The q4 GEMM's tiling plan (kernel_builder/gemm_q4/builder.py): the bf16 GEMM's plan (kernel_builder.gemm.plan)
with its W side in 4 bits.

Per launch point a herd column's W panel is the concatenation of all its tile_k slices in the L1 layout (codes of
the tile_n rows, then each row's scales and mins: gemm_q4/external.slice_bytes), one copy, filled by two L3 -> L2
DMAs (the codes; the scales and mins) and broadcast slice by slice with one contiguous put: two shim streams per W panel
(the plan's `w_parts = 2`, as the bf16 plan's two-part W panel). In L1 each core also holds the dequantized bf16
W tile the mac multiplies. `plan_gemm_q4` returns the plan the cost model times fastest among the fitting ones, or
raises ValueError naming the limit."""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass

from kernel_builder.external_costs import call_counts
from kernel_builder.gemm import plan as gp
from kernel_builder.gemm.external import GEMM_M_MULTIPLE, GEMM_N_MULTIPLE, scratch_elems
from kernel_builder.gemm_q4.external import gemm_q4_kernels, slice_bytes
from kernel_builder.gemv_q4.format import Q4Layout
from kernel_builder.hw import cost
from kernel_builder.hw.results import Flow
from kernel_builder.planner import BF16, F32, L1_BUDGET, MEMTILE_BYTES, NPU2_COLS, NPU2_ROWS, check_positive, kib, widest_herd

MAX_TILE = gp.MAX_GEMM_TILE
# Herd rows per A panel: a W panel takes two S2MM channels of its memory tile (two loads) and a C row panel one per
# herd column, so on the 8x4 herd the bf16 GEMM's 8 A + 4 W + 8 C panels need 8 + 8 + 32 = 48 S2MM, all 8 memory
# tiles' channels, which the real lowering's placement did not pack (aie-create-pathfinder-flows failed, as for the
# bf16 GEMM's two-part W panel). One A panel per two herd rows leaves 44.
A_SHARE = 2
MAX_HERD_N = NPU2_ROWS


@dataclass(frozen=True)
class GemmQ4Plan(gp.GemmPlan):
    group: int = 32
    a_share: int = 1      # herd rows one A panel serves (A_SHARE when herd_m is a multiple of it)

    def l2_counts(self) -> dict[str, int]:
        return {"a_panel": self.herd_m // self.a_share, "w_panel": self.herd_n, "c_panel": self.herd_m}

    def l2_order(self) -> list[str]:
        """First transfers in program order: the W panels (loaded before the K loop), the A panels, the C panels."""
        return ["w"] * self.herd_n + ["a"] * (self.herd_m // self.a_share) + ["c"] * self.herd_m

    def memtile_bytes(self) -> int:
        """Bytes of the fullest memory tile under the round-robin placement in l2_order (a W panel holds all of k,
        so the uniform bound of the bf16 plan, buffers per tile x the largest, would refuse what fits)."""
        size = {"a": self.l2_buffers()["a_panel"], "w": self.l2_buffers()["w_panel"], "c": self.l2_buffers()["c_panel"]}
        tiles = [0] * gp.N_MEMTILES
        for i, kind in enumerate(self.l2_order()):
            tiles[i % gp.N_MEMTILES] += size[kind]
        return max(tiles)

    def memtile_channels(self) -> tuple[int, int]:
        """(S2MM, MM2S) of the busiest memory tile under AIR's round-robin placement in l2_order: an A panel 1 and
        a_share, a W panel 2 and 1, a C row panel herd_n and 1."""
        tiles = [[0, 0] for _ in range(gp.N_MEMTILES)]
        use = {"a": (1, self.a_share), "w": (2, 1), "c": (self.herd_n, 1)}
        for i, kind in enumerate(self.l2_order()):
            tiles[i % gp.N_MEMTILES][0] += use[kind][0]
            tiles[i % gp.N_MEMTILES][1] += use[kind][1]
        return max(t[0] for t in tiles), max(t[1] for t in tiles)

    def channels(self) -> dict[str, int]:
        s2mm, mm2s = self.memtile_channels()
        return {"shim_mm2s": self.herd_m // self.a_share + 2 * self.herd_n, "shim_s2mm": self.herd_m,
                "memtile_s2mm": s2mm, "memtile_mm2s": mm2s, "core_s2mm": 2, "core_mm2s": 1}

    @property
    def slice_bytes(self) -> int:
        return slice_bytes(self.tile_k, self.tile_n, self.group)

    def l1_buffers(self) -> dict[str, int]:
        c = self.copies(self.tile_k)
        return {"acc_f32": F32 * self.tile_m * self.tile_n,
                "a_tiles": c * BF16 * self.tile_m * self.tile_k,
                "w_q4_slices": c * self.slice_bytes,
                "a_bfp16": BF16 * scratch_elems(self.tile_m, self.tile_k),
                "w_bf16": BF16 * self.tile_n * self.tile_k}

    def l2_buffers(self) -> dict[str, int]:
        c = self.copies(self.tile_k_l2)
        return {"a_panel": c * BF16 * self.a_share * self.tile_m * self.tile_k_l2,
                "w_panel": (self.k // self.tile_k) * self.slice_bytes,    # all of k, loaded once per launch point
                "c_panel": BF16 * self.tile_m * self.bn_out}

    def memtile_bds(self) -> dict[str, int]:
        b = super().memtile_bds()
        return {**b, "w_put": self.copies(self.tile_k_l2)}   # one contiguous slice per put

    def w_row_bytes(self, k: int) -> int:
        return Q4Layout(k, self.group, True).row_bytes

    def ddr_read_bytes(self, m: int, k: int, n: int) -> int:
        """A as the bf16 GEMM reads it; each W row's codes, scales and mins once per launch row block."""
        return BF16 * m * k * (n // self.bn_out) + (k // 2 + 4 * k // self.group) * n * (m // self.bm)


def plan_gemm_q4(m: int, k: int, n: int, group: int = 32) -> GemmQ4Plan:
    """The fastest fitting plan of c[m, n] = a[m, k] . dequant(w_q4[n])^T."""
    check_positive("gemm_q4", m=m, k=k, n=n)
    Q4Layout(k, group, True)
    for name, v, q in (("m", m, GEMM_M_MULTIPLE), ("k", k, 2 * group), ("n", n, GEMM_N_MULTIPLE)):
        if v % q:
            raise ValueError(f"gemm_q4: {name}={v} must be a multiple of {q}")
    m_tiles = [t for t in range(MAX_TILE, 0, -GEMM_M_MULTIPLE) if m % t == 0]
    n_tiles = [t for t in range(MAX_TILE, 0, -GEMM_N_MULTIPLE) if n % t == 0]
    best, best_key = None, None
    for tile_k in (256, 128, 64):
        if k % tile_k or tile_k % (2 * group):
            continue
        for tile_m in m_tiles:
            for tile_n in n_tiles:
                for spread in (False, True):
                    hm = widest_herd(m // tile_m, NPU2_COLS)
                    p = GemmQ4Plan(tile_m, tile_k, tile_n, hm, widest_herd(n // tile_n, MAX_HERD_N), k=k, w_parts=2,
                                   spread=spread, group=group, a_share=A_SHARE if hm % A_SHARE == 0 else 1)
                    if (spread and p.herd_n == 1) or not gp._gemm_fits(p, k) or not gp._a_folds(p, k, n):
                        continue
                    key = (-round(math.log(modeled_seconds(p, m, k, n)) * 1000), p.herd_m * p.herd_n, tile_k,
                           tile_m * tile_n, -spread)
                    if best_key is None or key > best_key:
                        best, best_key = p, key
    if best is None:
        raise ValueError(f"gemm_q4: m={m}, k={k}, n={n}, group {group} has no tiling whose L1 buffers fit "
                         f"{kib(L1_BUDGET)} per tile and whose L2 panels fit one {kib(MEMTILE_BYTES)} memory tile")
    return _deepest(best, m, k, n)


def _deepest(p: GemmQ4Plan, m: int, k: int, n: int) -> GemmQ4Plan:
    """The deepest L2 K step (a multiple of tile_k dividing k, at most the bf16 plan's MAX_GEMM_L2_K) that fits."""
    steps = k // p.tile_k
    for d in sorted((d for d in range(1, steps + 1) if steps % d == 0), reverse=True):
        if p.tile_k * d > gp.MAX_GEMM_L2_K:
            continue
        q = GemmQ4Plan(p.tile_m, p.tile_k, p.tile_n, p.herd_m, p.herd_n, p.tile_k * d, k, 2, "none", p.spread,
                       p.group, p.a_share)
        if gp._gemm_fits(q, k):
            return q
    return p


def gemm_q4_flows(p: GemmQ4Plan, m: int, k: int, n: int) -> list[Flow]:
    """The shim streams in the builder's program order: per launch point each W panel's codes and scales + mins
    loads, then the A panel loads (one per a_share herd rows), and one C row panel write per herd row."""
    points = (m // p.bm) * (n // p.bn_out)
    loads = [p.tile_n * k // 2, p.tile_n * 4 * k // p.group] * p.herd_n \
        + [BF16 * p.a_share * p.tile_m * k] * (p.herd_m // p.a_share)
    flows = [Flow("MM2S", i, "w" if i < 2 * p.herd_n else "a", b * points, 1, 1, column=i // gp.SHIM_DMA_PER_COL)
             for i, b in enumerate(loads)]
    flows += [Flow("S2MM", i, "c", BF16 * p.tile_m * p.bn_out * points, 1, 1, column=i // gp.SHIM_DMA_PER_COL)
              for i in range(p.herd_m)]
    return flows


def modeled_seconds(p: GemmQ4Plan, m: int, k: int, n: int, params: cost.CostParams = cost.PARAMS) -> float:
    """The cost model's charge of this plan in closed form (as gp.modeled_seconds): the busiest tile's counted
    calls (the mac with its dequantization), the shim streams, the busier L2 -> L1 stream (A bf16 or W q4 slices)."""
    points = (m // p.bm) * (n // p.bn_out)
    compute = cost.compute_cycles(tile_counts(p, k, points), params) / params.clock_hz
    # the busier of a core's two input streams (A bf16, W q4 slices), as the analyzer charges it
    l1 = max(BF16 * p.tile_m * k, (k // p.tile_k) * p.slice_bytes) * points / params.l2_l1_bytes_per_s
    return max(compute, cost.shim_seconds(gemm_q4_flows(p, m, k, n), params), l1)


def tile_counts(p: GemmQ4Plan, k: int, tiles: int = 1) -> dict:
    ks = gemm_q4_kernels(p.tile_m, p.tile_k, p.tile_n, p.group)
    return call_counts(((ks.zero, 1), (ks.mac, k // p.tile_k), (ks.out, 1)), tiles)


@functools.lru_cache(maxsize=None)
def prefer_l1(m: int, k: int, n: int, group: int) -> bool:
    """Whether the counted cost model (kernel_builder.hw.cost, the launches as the hardware model analyzes them)
    times this q4 GEMM below dequant_q4 into a scratch + the bf16 GEMM at the same shape; False when no gemm_q4
    plan exists (e.g. k not a multiple of 2 x group) or the hardware model refuses it."""
    from kernel_builder.hw import analyze_module
    from kernel_builder.hw.tune import runtime_tiling
    from kernel_builder.presets import AirccPreset
    from kernel_builder.registry import kernel_text

    try:
        plan_gemm_q4(m, k, n, group)
    except ValueError:
        return False

    def launch_s(text: str):
        tiling = runtime_tiling(text)
        rep = analyze_module(text, preset=AirccPreset(runtime_loop_tiling_sizes=tiling) if tiling else AirccPreset())
        return cost.launch_cost(rep.launches[0].work).total_s if rep.ok else None

    l1 = launch_s(kernel_text("gemm_q4", m, k, n, group))
    scratch = launch_s(kernel_text("dequant_q4", n, k, group, 1)) + launch_s(kernel_text("gemm", m, k, n))
    return l1 is not None and l1 < scratch
