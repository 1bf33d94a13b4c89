"""The `attention_kv8` kernel's tiling plan (decode over the KV8 cache, kernel_builder/attention_kv8/builder.py):
herd_x splits of the KV window x herd_y kv heads, a merge herd [1, herd_y]; the same search as the bf16 decode
(kernel_builder/attention/plan.py) and streams: per split the tile's two halves of key blocks (codes and scales of
the herd_y heads: one contiguous run per position) and the query rows (3 shim streams), and the position
(3 * herd_x + 1 shim MM2S channels); a run of herd_y blocks stays within a shim BD dimension."""
from __future__ import annotations

from dataclasses import dataclass

from kernel_builder.attention.plan import (MEMTILE_CHANNELS, N_CORES, NPU2_MEMTILES, SHIM_MM2S, SHIM_S2MM,
                                          _attention_checks, query_rows_split)
from kernel_builder.attention_kv8.external import item_bytes
from kernel_builder.hw.facts import NPU2
from kernel_builder.kv_quant.reference import block_bytes
from kernel_builder.planner import BF16, F32, L1_BUDGET, L2_BUDGET, MEMTILE_BYTES, kib

KV8_DECODE_LK = (64, 32, 16)


@dataclass(frozen=True)
class AttentionKv8Plan:
    kv_rows: int
    heads: int
    kv_heads: int
    head_dim: int
    lk: int
    herd_x: int
    herd_y: int
    window: int = 0
    rows: int = 1

    @property
    def lq(self) -> int:
        return self.heads // self.kv_heads

    group = lq

    @property
    def launch_grid(self) -> tuple[int, ...]:
        return (self.kv_heads // self.herd_y,)

    @property
    def share(self) -> int:
        return self.kv_rows // self.herd_x

    @property
    def kv_tiles(self) -> int:
        return self.share // self.lk

    @property
    def item_bytes(self) -> int:
        return item_bytes(self.head_dim, self.lk, self.lq)

    @property
    def item_copies(self) -> int:
        return 1 if self.kv_tiles == 1 else (3 if self.kv_tiles % 2 else 2)

    @property
    def state_floats(self) -> int:
        return self.lq * (self.head_dim + 2)

    @property
    def cores(self) -> int:
        return self.herd_x * self.herd_y + self.herd_y

    def l1_buffers(self) -> dict[str, int]:
        hd, lk = self.head_dim, self.lk
        return {"items": self.item_copies * self.item_bytes, "state": F32 * self.state_floats, "pos": 4,
                # attention_kv8.h's dequantized K and V tile, attention.cc's decode scores / probabilities
                "scratch": 2 * BF16 * lk * hd + 4 * lk * (F32 + BF16)}

    def l1_merge_buffers(self) -> dict[str, int]:
        return {"partials": F32 * self.herd_x * self.state_floats, "out": BF16 * self.lq * self.head_dim}

    def l1_bytes(self) -> int:
        return max(sum(self.l1_buffers().values()), sum(self.l1_merge_buffers().values()))

    def l2_buffers(self) -> dict[str, int]:
        out = {f"items{x}": self.item_copies * self.item_bytes * self.herd_y for x in range(self.herd_x)}
        out.update({f"partials{y}": F32 * self.herd_x * self.state_floats for y in range(self.herd_y)})
        return out

    def channels(self) -> dict[str, int]:
        x, y = self.herd_x, self.herd_y
        return {"shim_mm2s": 3 * x + 1, "shim_s2mm": y, "memtile_s2mm": 3 * x + x * y,
                "memtile_mm2s": x * y + y, "core_s2mm": 2, "core_mm2s": 1}

    def fits(self) -> bool:
        ch = self.channels()
        return (self.l1_bytes() <= L1_BUDGET and all(b <= MEMTILE_BYTES for b in self.l2_buffers().values())
                and sum(self.l2_buffers().values()) <= L2_BUDGET and ch["shim_mm2s"] <= SHIM_MM2S
                and ch["shim_s2mm"] <= SHIM_S2MM and self.cores <= N_CORES)


def plan_attention_kv8(kv_rows: int, heads: int, kv_heads: int, head_dim: int,
                       window: int | None = None) -> AttentionKv8Plan:
    """The decode tiling over a `kv_rows` KV8 window: the most splits, then an even (or single) step count, then
    the most kv heads side by side, then big tiles (the bf16 decode's order)."""
    _attention_checks(1, kv_rows, heads, kv_heads, head_dim)
    fits = []
    for herd_x in (8, 4, 2, 1):
        if kv_rows % (herd_x * 16) or herd_x > MEMTILE_CHANNELS:
            continue
        for herd_y in (4, 2, 1):   # 3 gets and herd_y puts per split buffer: herd_y = 3 would be split (MIMO)
            if kv_heads % herd_y or herd_x + herd_y > NPU2_MEMTILES \
                    or herd_y * block_bytes(head_dim) > NPU2.shim_bd_max_size:
                continue
            for lk in KV8_DECODE_LK:   # two halves of whole 8-byte-aligned runs (lk / 2 keys each)
                if (kv_rows // herd_x) % lk == 0:
                    p = AttentionKv8Plan(kv_rows, heads, kv_heads, head_dim, lk, herd_x, herd_y, window or 0)
                    if p.fits() and not query_rows_split(herd_y, p.group, p.kv_tiles):
                        fits.append(p)
    if not fits:
        raise ValueError(f"attention_kv8: no decode tiling of kv_rows={kv_rows}, head_dim={head_dim} fits "
                         f"{kib(L1_BUDGET)} of L1 per tile, one {kib(MEMTILE_BYTES)} memory tile per L2 buffer and "
                         f"{SHIM_MM2S} shim MM2S channels")
    return max(fits, key=lambda p: (p.herd_x, p.item_copies < 3, p.herd_y, p.lk))
