"""Stream accounting of the resource analyzer (kernel_builder.hw.analyze): every DDR transfer becomes a shim
flow (channel ops on one channel index share one), herd DDR streams are circuit- or packet-switched as
air-dma-to-channel decides, L2 endpoints are dealt over the memory tiles, and shim flows over the shim columns;
each tile's channels, BDs and bytes are checked against the facts."""
from __future__ import annotations

from collections import Counter

from kernel_builder.hw import count as cnt
from kernel_builder.hw.dma import canonical_dims, linear_offset, shim_fold
from kernel_builder.hw.ir import L1, L2, L3, Access, Region, Transfer
from kernel_builder.hw.ir_nodes import Alloc, walk
from kernel_builder.hw.memtile_place import Bucket, affinity, place
from kernel_builder.hw.results import AIECC, AIR_TO_AIE, AIRRT_TO_NPU, Flow


# Whether segment DMA flows start at their memory tile's shim column, as mlir-air's ShimDMAAllocator does
# ("same_column", checked on the tool's aie.flow ops), instead of packing two per column in program order. Off:
# it changes the per-column shim BD counts, hence the runtime loop tiling the tuner picks for attention modules
# and the plans the GEMM planner ranks - modules not yet re-checked with the real lowering.
SHIM_SAME_COLUMN = False


def herd_name(h: Region) -> str:
    return f"@{h.symbol}" if h.symbol else "herd"


class FlowAccounting:
    """Shim flows, memory-tile endpoints and their allocation, mixed into analyze._LaunchAnalyzer (uses its
    `facts`, `preset`, `launch`, `copies`, `chained_writes`, `channel_flows`, `usage`, `violate` and the
    TransferChecks)."""

    # ---- segment-level transfers (L3 <-> L2 DMAs, channel puts/gets from L2 or L3)
    def _segment_transfer(self, t: Transfer, path, execs: int, flows: list, mem: dict) -> None:
        for side, acc in (("dst", t.dst), ("src", t.src)):
            if acc is None:
                continue
            inbound = side == "dst"
            self._check_side(t, acc, "memtile" if acc.buffer.space == L2 else
                             ("shim" if acc.buffer.space == L3 else "core"), path)
            if acc.buffer.space == L3:
                in_flight, folded, non_affine, stride, ndims, runs, split, note = shim_fold(
                    acc, path, self.launch, self.preset.runtime_loop_tiling_sizes, self.facts,
                    chained_write=inbound and acc.buffer in self.chained_writes,
                    launch_level=t in self.launch_level)
                self._check_shim_access(t, acc, stride, ndims, runs)
                flow = Flow("S2MM" if inbound else "MM2S", t.line, f"{t.kind} {acc.buffer.name}",
                            acc.nbytes * execs, max(1, execs // max(1, folded)), in_flight, non_affine, note=note)
                flow.leak = flow.tasks * (split - 1)
                other = t.src if inbound else t.dst
                if t.kind == "dma" and other is not None and other.buffer.space == L2:
                    flow.l2 = other.buffer
                elif t.kind != "dma":   # an L3 channel op: its L2 side is the matching get / put (_shim resolves it)
                    flow.l2 = self._chan_key(t.channel, t.indices, {})
                # channel ops on the same channel index share one shim allocation (the shim allocator reuses
                # the allocation of a channel declaration, AIRToAIESchedulingUtils.cpp): one stream, its
                # transfers issued one after the other - but each is its own DMA task holding its own BD, all
                # configured before any wait (the real lowering's runtime sequence: one bd_id per put; a probe
                # with 16 launch-level puts on one index exhausts the shim tile's 16 BDs), so their BDs add up
                key = (flow.direction, t.channel, tuple(str(i) for i in t.indices)) if t.kind != "dma" else None
                same = self.channel_flows.get(key) if key else None
                if same is not None:
                    same.bytes += flow.bytes
                    same.tasks += flow.tasks
                    same.pieces += flow.pieces
                    same.leak += flow.leak
                    same.note = same.note or flow.note
                    same.non_affine = same.non_affine or flow.non_affine
                    if acc.buffer.name not in same.what:
                        same.what += f" + {acc.buffer.name}"
                    continue
                if key:
                    self.channel_flows[key] = flow
                flows.append(flow)
            elif acc.buffer.space == L2:
                self._check_bd_chain(t, acc, path)
                item = mem.setdefault(acc.buffer, {"s2mm": 0, "mm2s": 0, "bds": 0, "line": t.line})
                item["s2mm" if inbound else "mm2s"] += 1
                item["bds"] += self.copies.get(acc.buffer, 1)
                if t.kind != "dma":   # the specialised channel this buffer's side uses (placement buckets)
                    key = self._chan_key(t.channel, t.indices, {})
                    item.setdefault("chans", set()).add(key)
                    self.chan_l2.setdefault(key, acc.buffer)

    def _check_bd_chain(self, t: Transfer, acc: Access, path) -> None:
        """The BD chain one memory-tile side of a segment transfer becomes (mlir-air air-opt-memtile-dma-bds:
        AIRSpecializeChannelWrapAndStrideInScfFor, then AIRUnrollScfForIntoBDChain): innermost loop first, a loop
        folds into the BD while the pattern has at most 3 non-unit dims and the offset is affine in its iv (a loop
        the offset does not depend on folds away, skipZeroStride); the first loop that does not fold and every
        loop around it are unrolled into one BD per iteration, except the loop allocating the buffer (the ping-pong
        loop) when no other segment loop encloses it (nested in one, the tool unrolled it too: the W panels of
        the A-resident GEMM in a K loop inside a column-block loop, 128 BDs per W broadcast at 2048x2048x8192;
        air-to-aie ran for more than 10 minutes). More BDs than a memory tile has: air-to-aie fails ("'aie.
        memtile_dma' op has more than 48 blocks"; the A-resident GEMM with [rows/8][tile_k/8][8][8] slices of a
        row-major panel in column-block x K loops: 128 BDs per A broadcast at 512x1024x1024, the AIR stage ran
        for hours at 2048x2048x8192)."""
        loops = [lp for lp in path if cnt.static_trip(lp) != 1]
        if not loops:
            return
        ndims = sum(1 for s_, _ in canonical_dims(acc) if s_ > 1)
        off = linear_offset(acc)
        owner = max((i for i, lp in enumerate(loops)   # the innermost loop allocating the buffer
                     if any(isinstance(n, Alloc) and n.buffer is acc.buffer for n in walk(lp.body))), default=None)
        bds, unrolled = 1, []
        for i in reversed(range(len(loops))):
            lp, trip = loops[i], cnt.static_trip(loops[i])
            if i == owner:
                if i == 0:
                    bds *= self.copies.get(acc.buffer, 1)   # the outermost ping-pong loop stays a loop
                    break
            elif not unrolled and trip is not None and off.affine_in(lp.iv):
                if lp.iv not in off.variables:
                    continue
                if ndims <= 3:
                    ndims += 1
                    continue
            unrolled.append(lp.iv)
            bds *= trip or 1
        if bds > self.facts.memtile_bds:
            self.violate("memtile", "BD chain", bds, self.facts.memtile_bds, AIR_TO_AIE,
                         f"{t.kind} {acc.buffer.name}: its {len(canonical_dims(acc))}-dim pattern cannot take the "
                         f"loops {', '.join(unrolled)} as BD dims (at most 4; a ping-pong loop inside another loop "
                         f"never stays a loop): air-opt-memtile-dma-bds unrolls them into one BD each "
                         f"('aie.memtile_dma' op has more than {self.facts.memtile_bds} blocks)",
                         t.line, kind="rule")

    # ---- which cores' columns each specialised channel reaches (memtile_place's column affinity)
    def _chan_key(self, channel: str, indices, env: dict, herd_side: bool = False) -> tuple:
        """(channel, index) of one specialised channel (air-to-aie's specializeChannelBundle gives each index its
        own channel); a herd-side index of a broadcast channel maps to the bundle index that feeds it."""
        size, bcast = self.m.channels.get(channel, ((), ()))
        idx = []
        for d, e in enumerate(indices):
            v = e.evaluate(env)
            if v is None:
                return (channel, None)   # not a constant: no single index (no affinity from it)
            if herd_side and d < len(size) and d < len(bcast) and bcast[d] > size[d] > 0:
                v //= bcast[d] // size[d]
            idx.append(v)
        return (channel, tuple(idx))

    def _herd_columns(self, herd: Region, only: dict | None) -> set:
        """The array columns of a herd's tiles (dim 0 runs over columns from the herd's x_loc, 0 when unplaced);
        `only`: {tile point: ...} restricts to those tiles."""
        x0 = herd.attributes.get("x_loc", 0) if isinstance(herd.attributes, dict) else 0
        x0 = x0 if isinstance(x0, int) else 0
        xs = range(herd.sizes[0] if herd.sizes else 1)
        return {x0 + x for x in xs if only is None or any(p[0] == x for p in only)}

    def _herd_channel_columns(self, herd: Region, paths: dict) -> None:
        """Record, for every channel op inside the herd, which columns' cores use each specialised channel."""
        import itertools
        points = list(itertools.product(*[range(n) for n in herd.sizes])) or [()]
        for t in (n for n in paths if isinstance(n, Transfer) and n.kind != "dma"):
            for pt in points:
                key = self._chan_key(t.channel, t.indices, dict(zip(herd.ids, pt)), herd_side=True)
                self.chan_cols.setdefault(key, set()).update(self._herd_columns(herd, {pt: 1}))

    # ---- herd-level DDR transfers and their streams
    @staticmethod
    def _shared(herd: Region, acc: Access) -> int:
        """How many tiles share one source stream of this herd-side access: AIR's broadcast detection looks at the
        offsets' dependence on the tile ids (not at the bounds of the loops around the DMA)."""
        deps = set().union(*(o.variables for o in acc.offsets))
        n = 1
        for size, v in zip(herd.sizes, herd.ids):
            if v not in deps:
                n *= size
        return n

    def _herd_transfer(self, herd, t: Transfer, path, per_tile, totals, bundles, mem) -> None:
        f = self.facts
        n_tiles = herd.n_instances
        for side, acc in (("dst", t.dst), ("src", t.src)):
            if acc is None:
                continue
            space = acc.buffer.space
            self._check_side(t, acc, {L1: "core", L2: "memtile", L3: "shim"}[space], path)
            if space == L1 or t.kind != "dma":
                continue  # channel ops in a herd talk to puts/gets elsewhere: counted on their side
            inbound_to_core = side == "src"  # the far side is the source: data flows into the core
            shared = self._shared(herd, acc)
            if not inbound_to_core and shared > 1:
                self.violate("shim" if space == L3 else "memtile", "S2MM fan-in", f"{shared} tiles per stream", 1,
                             AIR_TO_AIE, f"the store to {acc.buffer.name} does not depend on every tile id, so AIR's "
                             f"broadcast detection makes {shared} tiles write one stream: air-to-aie fails with "
                             f"'Fan-in for aie.flow isn't supported'", t.line, kind="rule")
            groups = n_tiles if not inbound_to_core else n_tiles // shared
            execs = totals[t]
            if space == L3:
                in_flight, folded, non_affine, stride, ndims, runs, split, _ = shim_fold(
                    acc, path, self.launch, self.preset.runtime_loop_tiling_sizes, f,
                    chained_write=not inbound_to_core and acc.buffer in self.chained_writes)
                self._check_shim_access(t, acc, stride, ndims, runs)
                per_tile_execs = execs / n_tiles  # averaged over the tiles (a causal herd is uneven)
                what = f"{'load' if inbound_to_core else 'store'} {acc.buffer.name} by {herd_name(herd)}" + \
                    (f" (shared by {shared} tiles)" if inbound_to_core and shared > 1 else "")
                bundles.append(dict(transfer=t, direction="MM2S" if inbound_to_core else "S2MM", line=t.line, what=what,
                                    groups=groups, broadcast=shared > 1, bytes=int(acc.nbytes * per_tile_execs),
                                    tasks=max(1, int(per_tile_execs) // max(1, folded)), in_flight=in_flight,
                                    non_affine=non_affine,
                                    leak=max(1, int(per_tile_execs) // max(1, folded)) * (split - 1)))
            else:
                item = mem.setdefault(acc.buffer, {"s2mm": 0, "mm2s": 0, "bds": 0, "line": t.line})
                item["mm2s" if inbound_to_core else "s2mm"] += groups
                item["bds"] += groups * self.copies.get(acc.buffer, 1)
                item.setdefault("cols", set()).update(self._herd_columns(herd, None))

    def _herd_streams(self, herd: Region, bundles: list, flows: list) -> set:
        """The shim streams of one herd's DDR transfers. air-dma-to-channel estimates the per-column pressure of
        the herd's L3 channels per direction (non-broadcast channels all count against one column, broadcast
        ones spread over the herd's columns) and, when it exceeds the shim's 2 channels per column, turns them
        all into packet flows that time-share one shim channel per column (AIRDmaToChannel.cpp). Otherwise each
        tile (or broadcast group) keeps a circuit-switched stream of its own."""
        cap = self.facts.shim_mm2s
        cols = min(herd.sizes[0] if herd.sizes else 1, self.facts.columns)
        packet: set = set()
        for direction in ("MM2S", "S2MM"):
            bs = [b for b in bundles if b["direction"] == direction]
            if not bs:
                continue
            plain = sum(1 for b in bs if not b["broadcast"])
            bcast = sum(1 for b in bs if b["broadcast"])
            pressure = plain + -(-bcast // cols)
            if pressure > cap:  # packet flows: one physical channel per herd column, shared by all
                total_bytes = sum(b["bytes"] * b["groups"] for b in bs)
                total_tasks = sum(b["tasks"] * b["groups"] for b in bs)
                in_flight = sum(b["in_flight"] * b["groups"] for b in bs) // cols
                what = f"{len(bs)} packet-switched {direction} channels of {herd_name(herd)}"
                leak = -(-sum(b["leak"] * b["groups"] for b in bs) // cols)
                for _ in range(cols):
                    flows.append(Flow(direction, bs[0]["line"], what, total_bytes // cols,
                                      max(1, total_tasks // cols), max(1, in_flight),
                                      any(b["non_affine"] for b in bs), leak=leak))
                packet |= {b["transfer"] for b in bs}
                continue
            for b in bs:
                for _ in range(b["groups"]):
                    flows.append(Flow(direction, b["line"], b["what"], b["bytes"], b["tasks"], b["in_flight"],
                                      b["non_affine"], leak=b["leak"]))
        return packet

    # ---- memory tiles: AIR's placement of the L2 buffers (air-split-l2-memref splits a buffer with too many
    # streams; then mlir-air AIRToAIEPass.cpp L2MemrefToMemTileMap buckets the allocations by shared channel, deals
    # the buckets round-robin over the memory tiles in allocation order and swaps buckets onto the memory tile of
    # the one core column their channels reach: kernel_builder.hw.memtile_place); every tile must then hold its
    # buffers' bytes, streams and BDs
    def _memtiles(self, items: dict) -> None:
        f = self.facts
        u = self.usage
        pieces = []
        for buf, it in items.items():  # allocation order (buffers without an alloc after, in transfer order)
            u.memtile_mm2s += it["mm2s"]
            u.memtile_s2mm += it["s2mm"]
            u.memtile_bds += it["bds"]
            u.l2_bytes += it["bytes"]
            if it["bytes"] > f.memtile_bytes:
                self.violate("memtile", "L2 bytes", it["bytes"], f.memtile_bytes, AIECC,
                             f"{buf.name} ({buf.nbytes} B x {self.copies.get(buf, 1)} copies) exceeds one memory tile",
                             it["line"])
                continue
            parts = max(1, -(-it["mm2s"] // f.memtile_mm2s), -(-it["s2mm"] // f.memtile_s2mm),
                        -(-it["bds"] // f.memtile_bds))
            for _ in range(parts):
                pieces.append((buf, {key: -(-it[key] // parts) for key in ("mm2s", "s2mm", "bds", "bytes")}, parts))
        buckets, members = self._buckets(pieces, items)
        where = place(buckets, f.memtiles, f.memtile_bytes)
        tiles = [{"mm2s": 0, "s2mm": 0, "bds": 0, "bytes": 0, "bufs": []} for _ in range(min(f.memtiles, len(buckets)))]
        for b, t_idx in enumerate(where):
            t = tiles[t_idx]
            for buf, piece, _ in members[b]:
                self.l2_tile.setdefault(buf, t_idx)
                for key in piece:
                    t[key] += piece[key]
                t["bufs"].append(buf.name)
        u.memtiles = len(tiles)
        self.work.l2_placement = [list(t["bufs"]) for t in tiles]
        for key, what, cap in (("s2mm", "S2MM channels", f.memtile_s2mm), ("mm2s", "MM2S channels", f.memtile_mm2s),
                               ("bds", "BDs", f.memtile_bds), ("bytes", "L2 bytes", f.memtile_bytes)):
            worst = max(range(len(tiles)), key=lambda i: tiles[i][key], default=None)
            if worst is not None and tiles[worst][key] > cap:
                t = tiles[worst]
                self.violate("memtile", what, t[key], cap, AIR_TO_AIE if key != "bytes" else AIECC,
                             f"memory tile {worst} gets {', '.join(t['bufs'])} (air-to-aie's L2 placement: "
                             f"round-robin over {f.memtiles} memory tiles in allocation order, then swaps onto "
                             f"each buffer's one core column)")

    def _buckets(self, pieces: list, items: dict) -> tuple[list[Bucket], list[list]]:
        """memtile_place buckets of the L2 pieces: whole buffers sharing a (constant-index) channel join one bucket;
        a bucket's affinity is the one core column its channels (and herd DMAs) reach."""
        buckets: list[Bucket] = []
        members: list[list] = []
        keys: list[set] = []
        for buf, piece, parts in pieces:
            it = items[buf]
            chans = {k for k in it.get("chans", ()) if k[1] is not None}
            b = next((i for i, ks in enumerate(keys) if parts == 1 and ks & chans), None)
            if b is None:
                cols = set(it.get("cols", ()))
                for k in it.get("chans", ()):
                    cols |= self.chan_cols.get(k, set())
                buckets.append(Bucket(buf.name, 0, affinity(cols)))
                members.append([])
                keys.append(chans if parts == 1 else set())
                b = len(buckets) - 1
            buckets[b].nbytes += piece["bytes"]
            members[b].append((buf, piece, parts))
        return buckets, members

    # ---- shim columns: the allocator walks the columns, two channels per direction each
    def _columns(self, fl: list[Flow], cap_col: int, same_column: bool) -> list[int]:
        """The shim column of each flow of one direction (program order). A segment DMA's flow starts at its L2
        buffer's memory-tile column and walks right to the first column with a free channel
        (ShimDMAAllocator::allocNewDmaChannel, "same_column") when `same_column`; the others (herd DMAs) fill the
        columns two channels at a time in program order. An L3 channel op (a launch-level put of the A-resident
        GEMM's W stream) always starts at its get's memory-tile column: checked on the tool's aie.flow ops
        (2048x2048x8192: W panel j from shim column j beside A panel j)."""
        f = self.facts
        taken = Counter()
        packed, out = 0, []
        for x in fl:
            if isinstance(x.l2, tuple):
                home = self.l2_tile.get(self.chan_l2.get(x.l2))
            else:
                home = self.l2_tile.get(x.l2) if same_column and x.l2 is not None else None
            col = home if home is not None else packed
            for _ in range(f.columns):
                if taken[col] < cap_col:
                    break
                col = (col + 1) % f.columns
            else:
                col = f.columns + len(fl)   # over the limit: reported below
            out.append(col)
            taken[col] += 1
            if home is None:
                packed = col
        return out

    def _shim(self, flows: list[Flow]) -> None:
        f = self.facts
        u = self.usage
        per_col_bds = Counter()
        seq_bds = Counter()
        for direction, cap_col in (("MM2S", f.shim_mm2s), ("S2MM", f.shim_s2mm)):
            fl = sorted((x for x in flows if x.direction == direction), key=lambda x: x.line)
            for x, col in zip(fl, self._columns(fl, cap_col, SHIM_SAME_COLUMN)):
                x.column = col
                per_col_bds[x.column] += x.pieces
                if x.leak:
                    u.shim_leak[x.column] = u.shim_leak.get(x.column, 0) + x.leak
            # the tool's own placement (segment DMAs at their memory tile's column) for the BDs a module's launches
            # hold and leave over its whole runtime sequence (module_report.sequence_bd_leaks)
            for x, col in zip(fl, self._columns(fl, cap_col, True)):
                seq_bds[col] += x.pieces
                if x.leak:
                    u.seq_leak[col] = u.seq_leak.get(col, 0) + x.leak
            total = len(fl)
            if direction == "MM2S":
                u.shim_mm2s = total
            else:
                u.shim_s2mm = total
            cap = f.columns * cap_col
            if total > cap:
                kinds = Counter(x.what for x in fl)
                top = ", ".join(f"{n} x {w}" for w, n in kinds.most_common(3))
                # air-to-aie: "'air.channel.get' op failed to map to shim dma channels: out of channels."
                self.violate("shim", f"{direction} channels", total, cap, AIR_TO_AIE,
                             f"{top} ({cap_col} per shim column x {f.columns} columns)", fl[cap].line)
        u.shim_bds = max(per_col_bds.values(), default=0)
        u.shim_bds_by_column = dict(per_col_bds)
        u.seq_bds_by_column = dict(seq_bds)
        u.shim_tasks = sum(x.tasks for x in flows)
        for col, n in sorted(per_col_bds.items()):
            if n > f.shim_bds:
                heavy = max((x for x in flows if x.column == col), key=lambda x: x.pieces)
                self.violate("shim", "BDs", n, f.shim_bds, AIECC,
                             f"column {col}: {heavy.what} keeps {heavy.pieces} DMA tasks in flight (one per transfer on "
                             f"its channel index and per launch iteration its BD cannot fold, issued before any "
                             f"wait; runtime loop tiling recycles BDs per tile)"
                             + (f"; {heavy.note}" if heavy.note else ""), heavy.line)
                break
        bad = [x for x in flows if x.non_affine]
        if bad:
            worst = max(bad, key=lambda x: x.tasks)
            self.violate("shim", "DMA offset", "div/rem", "affine", AIRRT_TO_NPU,
                         f"{worst.what}: air-opt-shim-dma-bds cannot fold a div/rem offset ('unknown ssa offset "
                         f"producer, NYI'); the lowering then repeats one transfer instead of walking the loop "
                         f"(wrong data) or fails to legalize the shim DMA", worst.line, kind="rule")
