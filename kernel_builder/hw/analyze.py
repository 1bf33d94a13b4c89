"""The resource analyzer: every launch of a module text checked against the NPU2 facts, counted the way
mlir-air's lowering allocates (docs/hardware-model.md, "What the analyzer counts").

Per launch: DMA channel endpoints on core tiles, memory tiles and shim columns; buffer descriptors per tile
(shim BDs after wrap/stride folding and runtime loop tiling); L1 and L2 peak bytes with ping-pong copies
where the transform applies and the core stack; transfer sizes, alignment and BD dimensions; the
air-dma-to-channel dominance pattern; non-affine shim offsets in loops; stack needs; and the work each herd
tile does (vector, matmul, scalar) for the cost model.
"""
from __future__ import annotations

from collections import Counter

from kernel_builder import presets as presets_mod
from kernel_builder.external_costs import external_cost
from kernel_builder.hw import count as cnt
from kernel_builder.hw import ir
from kernel_builder.hw.facts import NPU2, NPU2Facts
from kernel_builder.hw.dma import (canonical_dims, is_contiguous, iteration_space, launch_window, linear_offset,
                                   shim_fold)
from kernel_builder.hw.ir import L1, L2, L3, Access, Alloc, Buffer, Call, Compute, Loop, Region, Transfer
from kernel_builder.hw.results import STAGES, Flow, LaunchReport, Usage, Violation, Work

__all__ = ["analyze_launches", "STAGES", "Flow", "LaunchReport", "Usage", "Violation", "Work"]


class _LaunchAnalyzer:
    def __init__(self, module: ir.Module, name: str, index: int, launch: Region, preset, facts: NPU2Facts):
        self.m, self.name, self.index, self.launch, self.preset, self.facts = module, name, index, launch, preset, facts
        kernel = launch.attributes.get("llama_npu.kernel")
        kind = kernel.get("kind") if isinstance(kernel, dict) else None
        syms = [r.symbol for r in self._regions(launch.body) if r.symbol]
        self.launch_name = " ".join(x for x in (kind, f"@{syms[0]}" if syms else None) if x) or "launch"
        self.violations: list[Violation] = []
        self.usage = Usage(stack_bytes=preset.stack_size)
        self.work = Work(launch_iterations=launch.n_instances)
        self.copies: dict[Buffer, int] = {}
        self.alloc_loop: dict[Buffer, Loop | None] = {}   # the loop a buffer is allocated in (None: none)

    @staticmethod
    def _regions(block):
        return [n for n in ir.walk(block) if isinstance(n, Region)]

    def violate(self, tile, resource, used, available, stage, detail, line=0, kind="resource"):
        self.violations.append(Violation(self.name, self.index, self.launch_name, tile, resource, used, available,
                                         stage, kind, detail, line))

    # ---- ping-pong
    def _pingpong(self, block, space: int) -> None:
        """Copies of each buffer allocated in `block` (mlir-air's air-label-scf-for-to-ping-pong +
        air-ping-pong-transform): every buffer allocated directly in a loop of >= 2 trips (trip-1 loops are
        gone after canonicalization) is duplicated when the loop is a candidate: each of its buffers is first
        accessed by a definite write (a transfer into it, a store, a write-only linalg op - an external call
        may read, so it disqualifies the loop), no loop nested in it is disqualified, and the preset does not
        omit ping-pong for a memory space the loop allocates in."""
        omit = self.preset.omit_pingpong
        paths = cnt.loop_paths(block)
        owner: dict = {}                       # alloc -> the loop that owns it (None: not in a loop)
        for node, path in paths.items():
            if isinstance(node, Alloc):
                loops = [lp for lp in path if cnt.static_trip(lp) != 1]
                owner[node] = loops[-1] if loops else None
        by_loop: dict = {}
        for a, lp in owner.items():
            by_loop.setdefault(lp, []).append(a)

        def unsafe(lp) -> bool:
            seen = set()
            for n in ir.walk(lp.body):
                for a in by_loop.get(lp, ()):
                    b = a.buffer
                    if b in seen or not (_reads(n, b) or _writes(n, b)):
                        continue
                    seen.add(b)
                    definite = (isinstance(n, Transfer) and n.dst is not None and n.dst.buffer is b) or \
                        (isinstance(n, Compute) and b in n.writes and b not in n.reads)
                    if not definite:
                        return True
            return False

        def candidate(lp) -> bool:
            allocs = by_loop.get(lp, [])
            if not allocs or unsafe(lp):
                return False
            if any(n is not lp and isinstance(n, Loop) and cnt.static_trip(n) != 1 and unsafe(n)
                   for n in ir.walk(lp.body)):
                return False
            spaces = {a.buffer.space for a in allocs}
            return not (omit == "all" or (omit == "L1" and L1 in spaces) or (omit == "L2" and L2 in spaces))

        verdict = {lp: candidate(lp) for lp in by_loop if lp is not None}
        for a, lp in owner.items():
            self.alloc_loop[a.buffer] = lp
            if a.buffer.space == space:
                self.copies[a.buffer] = pingpong_copies(cnt.static_trip(lp)) if lp is not None and verdict[lp] else 1

    # ---- main
    def run(self) -> LaunchReport:
        launch_env_list = cnt.region_instances(self.launch, {})
        shim_flows: list[Flow] = []
        mem_items: dict[Buffer, dict] = {}
        launch_paths = cnt.loop_paths(self.launch.body)
        segments = [n for n in self.launch.body.nodes if isinstance(n, Region) and n.kind == "segment"]
        # transfers at launch level (outside segments) behave like segment-level ones
        seg_like = [(self.launch.body, launch_paths)] + [(s.body, cnt.loop_paths(s.body)) for s in segments]
        tile_work = []
        for block, paths in seg_like:
            self._pingpong(block, L2)
            seg_counts = Counter()
            for env, mult in launch_env_list:
                c = cnt.count(block, env)
                for k, v in c.items():
                    seg_counts[k] += v * mult
            for node, path in paths.items():
                if isinstance(node, Transfer):
                    self._segment_transfer(node, path, seg_counts[node], shim_flows, mem_items)
            for herd in [n for n in paths if isinstance(n, Region) and n.kind == "herd"]:
                tile_work.append(self._herd(herd, launch_env_list, shim_flows, mem_items))
        for buf, item in mem_items.items():
            item["bytes"] = buf.nbytes * self.copies.get(buf, 1)
        self._memtiles(mem_items)
        self._shim(shim_flows)
        self.work.flows = shim_flows
        if tile_work:
            self.work.tile_vector_cycles = max(w[0] for w in tile_work)
            self.work.tile_matmul_macs = max(w[1] for w in tile_work)
            self.work.tile_scalar_ops = max(w[2] for w in tile_work)
            self.work.tile_scores = max(w[3] for w in tile_work)
            self.work.tile_mmul_macs = max(w[4] for w in tile_work)
        return LaunchReport(self.index, self.launch_name, self.usage, self.work, self.violations)

    # ---- segment-level transfers (L3 <-> L2 DMAs, channel puts/gets from L2 or L3)
    def _segment_transfer(self, t: Transfer, path, execs: int, flows: list, mem: dict) -> None:
        for side, acc in (("dst", t.dst), ("src", t.src)):
            if acc is None:
                continue
            inbound = side == "dst"
            self._check_side(t, acc, "memtile" if acc.buffer.space == L2 else
                             ("shim" if acc.buffer.space == L3 else "core"), path)
            if acc.buffer.space == L3:
                pieces, folded, non_affine, stride, lfold = shim_fold(acc, path, self.launch,
                                                                      self.preset.runtime_loop_tiling_sizes,
                                                                      self.facts, reads_ddr=not inbound)
                self._check_shim_stride(t, acc, stride)
                flows.append(Flow("S2MM" if inbound else "MM2S", t.line, f"{t.kind} {acc.buffer.name}",
                                  acc.nbytes * execs, max(1, execs // max(1, folded)), pieces, non_affine,
                                  held=self._held(pieces, lfold)))
            elif acc.buffer.space == L2:
                item = mem.setdefault(acc.buffer, {"s2mm": 0, "mm2s": 0, "bds": 0, "line": t.line})
                item["s2mm" if inbound else "mm2s"] += 1
                bds = self.copies.get(acc.buffer, 1) * self._unfolded_l2_iterations(acc, path)
                item["bds"] += bds
                if bds > self.facts.memtile_bds_per_channel:
                    self.violate("memtile", "BDs per channel", bds, self.facts.memtile_bds_per_channel,
                                 STAGES[3], f"{t.kind} on {acc.buffer.name}: one BD per buffer copy and per "
                                 f"iteration of the loops inside its allocation that its {len(canonical_dims(acc))}"
                                 f"-dim access pattern cannot fold (memory-tile BDs have 4 dims)", t.line)

    def _unfolded_l2_iterations(self, acc: Access, path) -> int:
        """Iterations of the loops between a memory-tile buffer's allocation and a transfer on it that need a
        BD each: air-opt-memtile-dma-bds folds such a loop into the BD while the access pattern has a free
        dimension (memory-tile BDs have 4) and the offset is affine in the iv; otherwise each iteration is its
        own BD in the channel's chain."""
        home = self.alloc_loop.get(acc.buffer)
        loops = [lp for lp in path if cnt.static_trip(lp) != 1]
        if home in loops:
            loops = loops[loops.index(home) + 1:]
        dims = sum(1 for s, _ in canonical_dims(acc) if s > 1)
        off = linear_offset(acc)
        n = 1
        for lp in reversed(loops):
            trip = cnt.static_trip(lp) or 1
            if dims < self.facts.memtile_bd_dims and off.affine_in(lp.iv):
                dims += 1
            else:
                n *= trip
        return n

    # ---- herds
    def _herd(self, herd: Region, launch_envs, flows: list, mem: dict) -> tuple[float, int, int, int]:
        f = self.facts
        n_tiles = herd.n_instances
        self.usage.herd_tiles = max(self.usage.herd_tiles, n_tiles)
        paths = cnt.loop_paths(herd.body)
        self._pingpong(herd.body, L1)
        # per tile counts
        per_tile: list[tuple[dict, Counter, int]] = []   # (env, counts of one execution, multiplicity)
        by_tile: dict[tuple, list[tuple[Counter, int]]] = {}  # herd tile -> its executions over the launch grid
        for lenv, lmult in launch_envs:
            for henv, hmult in cnt.region_instances(herd, lenv):
                c = cnt.count(herd.body, henv)
                per_tile.append((henv, c, hmult * lmult))
                key = tuple(henv.get(i) for i in herd.ids)
                by_tile.setdefault(key, []).append((c, lmult))
        totals = Counter()
        for _, c, mult in per_tile:
            for k, v in c.items():
                totals[k] += v * mult
        # L1, stack, core channels and BDs (identical on every tile of a herd)
        l1 = sum(b.nbytes * self.copies.get(b, 1) for b in (n.buffer for n in paths if isinstance(n, Alloc))
                 if b.space == L1)
        stack_need = f.default_stack_bytes
        mm2s = s2mm = bds = 0
        locked: set[Buffer] = set()
        for n in paths:
            if isinstance(n, Compute) and n.divf:
                stack_need = max(stack_need, f.soft_float_div_stack_bytes)
            if isinstance(n, Call):
                ec = external_cost(n.symbol)
                if ec is not None:
                    stack_need = max(stack_need, ec[0].stack_bytes)
            if isinstance(n, Transfer):
                for side, acc in (("dst", n.dst), ("src", n.src)):
                    if acc is not None and acc.buffer.space == L1:
                        if side == "dst":
                            s2mm += 1
                        else:
                            mm2s += 1
                        bds += self.copies.get(acc.buffer, 1)
                        locked.add(acc.buffer)
        u = self.usage
        u.l1_bytes = max(u.l1_bytes, l1 + self.preset.stack_size)
        u.stack_need = max(u.stack_need, stack_need)
        u.core_mm2s, u.core_s2mm = max(u.core_mm2s, mm2s), max(u.core_s2mm, s2mm)
        u.core_bds = max(u.core_bds, bds)
        u.core_locks = max(u.core_locks, 2 * len(locked))
        hname = f"herd @{herd.symbol}" if herd.symbol else "herd"
        if s2mm > f.core_s2mm:
            self.violate("core", "S2MM channels", s2mm, f.core_s2mm, STAGES[1],
                         f"each tile of {hname} receives {s2mm} streams (one DMA channel per stream)", herd.line)
        if mm2s > f.core_mm2s:
            self.violate("core", "MM2S channels", mm2s, f.core_mm2s, STAGES[1],
                         f"each tile of {hname} sends {mm2s} streams", herd.line)
        if l1 + self.preset.stack_size > f.core_memory_bytes:
            parts = ", ".join(f"{b.name} {b.nbytes}x{self.copies.get(b, 1)}" for b in
                              (n.buffer for n in paths if isinstance(n, Alloc)) if b.space == L1)
            self.violate("core", "L1 bytes", l1 + self.preset.stack_size, f.core_memory_bytes, STAGES[3],
                         f"{hname}: {parts} + stack {self.preset.stack_size} (ping-pong copies counted)", herd.line)
        if bds > f.core_bds:
            self.violate("core", "BDs", bds, f.core_bds, STAGES[3], f"{hname}: one BD per transfer and buffer copy",
                         herd.line)
        if 2 * len(locked) > f.core_locks:
            self.violate("core", "locks", 2 * len(locked), f.core_locks, STAGES[3], f"{hname}: two per DMA'd buffer",
                         herd.line)
        if stack_need > self.preset.stack_size:
            self.violate("core", "stack bytes", stack_need, self.preset.stack_size, STAGES[4],
                         f"{hname} calls soft-float division (scalar divf/rsqrt or an external kernel's "
                         f"scalar division); raise aircc --stack-size", herd.line, kind="rule")
        self._dominance(herd, paths, n_tiles)
        # transfers: shim flows, memtile endpoints, checks
        for t in [n for n in paths if isinstance(n, Transfer)]:
            self._herd_transfer(herd, t, paths[t], per_tile, totals, flows, mem)
        # work
        best = (0.0, 0, 0, 0, 0)   # the busiest tile over the whole launch grid (launch iterations run in turn)
        for runs in by_tile.values():
            vec = mm = sc = sc_ = mmul = 0
            for c, lmult in runs:
                for n, k in c.items():
                    k *= lmult
                    if isinstance(n, Call):
                        ec = external_cost(n.symbol)
                        if ec is not None:
                            w = ec[0].work(ec[1], n.args)
                            vec += w.vector_cycles * k
                            sc += w.scalar_ops * k
                            sc_ += w.scores * k
                            mmul += w.mmul_macs * k
                    elif isinstance(n, Compute):
                        if n.kind == "matmul":
                            mm += n.macs * k
                        else:
                            sc += n.macs * k
            best = max(best, (vec, mm, sc, sc_, mmul))
        for n, k in totals.items():
            if isinstance(n, Call):
                ec = external_cost(n.symbol)
                if ec is not None:
                    self.work.vector_macs += ec[0].work(ec[1], n.args).vector_macs * k
            elif isinstance(n, Compute):
                self.work.scalar_macs += n.macs * k
        return best

    def _dominance(self, herd: Region, paths: dict, n_tiles: int) -> None:
        """air-dma-to-channel: an L1 buffer filled by a DMA outside a loop of a multi-tile herd and read inside
        that loop fails with 'operand does not dominate this use'."""
        if n_tiles <= 1:
            return
        for t in [n for n in paths if isinstance(n, Transfer) and n.kind == "dma"]:
            if t.dst is None or t.dst.buffer.space != L1 or t.src is None or t.src.buffer.space != L3:
                continue
            outer = tuple(lp for lp in paths[t] if cnt.static_trip(lp) != 1)
            for n, p in paths.items():
                if n is t or not _reads(n, t.dst.buffer):
                    continue
                inner = tuple(lp for lp in p if cnt.static_trip(lp) != 1)
                if len(inner) > len(outer) and inner[:len(outer)] == outer:
                    self.violate("core", "DMA placement", "load outside the loop", "load inside it", STAGES[0],
                                 f"{t.dst.buffer.name} is loaded once outside the loop at line "
                                 f"{inner[len(outer)].line} of a {n_tiles}-tile herd and read inside it: "
                                 f"air-dma-to-channel fails with 'operand does not dominate this use'", t.line,
                                 kind="rule")
                    break

    def _herd_transfer(self, herd, t: Transfer, path, per_tile, totals, flows, mem) -> None:
        f = self.facts
        n_tiles = herd.n_instances
        for side, acc in (("dst", t.dst), ("src", t.src)):
            if acc is None:
                continue
            space = acc.buffer.space
            self._check_side(t, acc, {L1: "core", L2: "memtile", L3: "shim"}[space], path)
            if space == L1:
                continue
            inbound_to_core = side == "src"  # the far side is the source: data flows into the core
            if t.kind == "dma":
                deps = cnt.deps_through_loops(acc.offsets, path)
                dims = [s for s, v in zip(herd.sizes, herd.ids) if v in deps]
                groups = 1
                for s in dims:
                    groups *= s
                if not inbound_to_core:  # stores: one stream per tile, DDR/L2 writes never merge
                    groups = n_tiles
            else:
                groups = 0  # channel ops in a herd talk to puts/gets elsewhere: counted on their side
            if groups == 0:
                continue
            execs = totals[t]
            if space == L3:
                pieces, folded, non_affine, stride, lfold = shim_fold(acc, path, self.launch,
                                                                      self.preset.runtime_loop_tiling_sizes, f,
                                                                      reads_ddr=inbound_to_core)
                self._check_shim_stride(t, acc, stride)
                per_tile_execs = execs / n_tiles  # averaged over the tiles (a causal herd is uneven)
                per_group_bytes = int(acc.nbytes * per_tile_execs)
                per_group_tasks = max(1, int(per_tile_execs) // max(1, folded))
                what = f"{'load' if inbound_to_core else 'store'} {acc.buffer.name} by {herd_name(herd)}" + \
                    (f" (shared by {n_tiles // groups} tiles)" if inbound_to_core and groups < n_tiles else "")
                for _ in range(groups):
                    flows.append(Flow("MM2S" if inbound_to_core else "S2MM", t.line, what, per_group_bytes,
                                      per_group_tasks, pieces, non_affine, held=self._held(pieces, lfold)))
            else:
                item = mem.setdefault(acc.buffer, {"s2mm": 0, "mm2s": 0, "bds": 0, "line": t.line})
                item["mm2s" if inbound_to_core else "s2mm"] += groups
                item["bds"] += groups * self.copies.get(acc.buffer, 1)

    def _check_shim_stride(self, t: Transfer, acc: Access, stride: int) -> None:
        limit = self.facts.shim_bd_max_stride
        if stride * acc.buffer.type.elem_bytes // self.facts.transfer_granularity_bytes > limit:
            self.violate("shim", "BD stride", stride, limit, STAGES[2],
                         f"{acc.buffer.name}: a stride of {stride} elements after folding the enclosing loops "
                         f"exceeds the shim BD's 20-bit step (in 32-bit words)", t.line)

    # ---- transfer checks (one side)
    def _check_side(self, t: Transfer, acc: Access, tile: str, loops: tuple[Loop, ...] = ()) -> None:
        f = self.facts
        g = f.transfer_granularity_bytes
        eb = acc.buffer.type.elem_bytes
        stage = STAGES[2] if tile == "shim" else STAGES[1]
        nbytes = acc.nbytes
        if nbytes < g or nbytes % g:
            self.violate(tile, "DMA transfer bytes", nbytes, f"multiple of {g}", stage,
                         f"{t.kind} on {acc.buffer.name} moves {acc.elements} x {eb} B; DMAs move 32-bit words",
                         t.line)
            return
        dims = canonical_dims(acc)
        inner_size, inner_stride = dims[-1]
        if inner_stride != 1 and eb < 4:
            self.violate(tile, "DMA inner stride", inner_stride, 1, stage,
                         f"{acc.buffer.name}: for sub-32-bit elements the innermost stride must be 1", t.line)
        elif inner_stride == 1 and (inner_size * eb) % g:
            self.violate(tile, "DMA inner run bytes", inner_size * eb, f"multiple of {g}", stage,
                         f"{acc.buffer.name}: contiguous runs of {inner_size} x {eb} B", t.line)
        for s, st in dims[:-1]:
            if (st * eb) % g:
                self.violate(tile, "DMA stride bytes", st * eb, f"multiple of {g}", stage,
                             f"{acc.buffer.name}: stride {st} elements", t.line)
                break
        off = iteration_space(linear_offset(acc), loops)
        if off.is_affine and ((off.const * eb) % g or any((c * eb) % g for _, c in off.terms)):
            self.violate(tile, "DMA offset alignment", f"{off} x {eb} B", f"{g}-byte aligned", stage,
                         f"{acc.buffer.name}: offsets must be {g}-byte aligned", t.line)
        if tile in ("core", "memtile") and not is_contiguous(acc):
            max_dims = f.core_bd_dims if tile == "core" else f.memtile_bd_dims
            if len(dims) > max_dims:
                self.violate(tile, "BD dimensions", len(dims), max_dims, STAGES[1],
                             f"{acc.buffer.name}: access pattern {dims}", t.line)
            for s, st in dims:
                if s > f.bd_max_size or st > f.bd_max_stride:
                    self.violate(tile, "BD wrap/stride", f"{s}/{st}", f"{f.bd_max_size}/{f.bd_max_stride}",
                                 STAGES[1], f"{acc.buffer.name}: access pattern {dims}", t.line)
                    break

    # ---- memory tiles: AIR's placement of the L2 buffers (air-split-l2-memref splits a buffer with too many
    # streams; mlir-air AIRToAIEPass.cpp L2MemrefToMemTileMap then deals the buffers round-robin over the
    # memory tiles in program order, without looking at streams - its later column-affinity swaps keep each
    # tile's buffer count); every tile must then hold its buffers' bytes, streams and BDs
    def _memtiles(self, items: dict) -> None:
        f = self.facts
        u = self.usage
        pieces = []
        for buf, it in items.items():  # insertion order: the program order of each buffer's first transfer
            u.memtile_mm2s += it["mm2s"]
            u.memtile_s2mm += it["s2mm"]
            u.memtile_bds += it["bds"]
            u.l2_bytes += it["bytes"]
            if it["bytes"] > f.memtile_bytes:
                self.violate("memtile", "L2 bytes", it["bytes"], f.memtile_bytes, STAGES[3],
                             f"{buf.name} ({buf.nbytes} B x {self.copies.get(buf, 1)} copies) exceeds one memory tile",
                             it["line"])
                continue
            parts = max(1, -(-it["mm2s"] // f.memtile_mm2s), -(-it["s2mm"] // f.memtile_s2mm),
                        -(-it["bds"] // f.memtile_bds))
            for _ in range(parts):
                piece = {key: -(-it[key] // parts) for key in ("mm2s", "s2mm", "bds", "bytes")}
                pieces.append((buf, piece))
        tiles = [{"mm2s": 0, "s2mm": 0, "bds": 0, "bytes": 0, "bufs": []} for _ in range(min(f.memtiles, len(pieces)))]
        for i, (buf, piece) in enumerate(pieces):
            t = tiles[i % f.memtiles]
            for key in piece:
                t[key] += piece[key]
            t["bufs"].append(buf.name)
        u.memtiles = len(tiles)
        caps = (("s2mm", "S2MM channels", f.memtile_s2mm), ("mm2s", "MM2S channels", f.memtile_mm2s),
                ("bds", "BDs", f.memtile_bds), ("bytes", "L2 bytes", f.memtile_bytes))
        for key, what, cap in caps:
            worst = max(range(len(tiles)), key=lambda i: tiles[i][key], default=None)
            if worst is not None and tiles[worst][key] > cap:
                t = tiles[worst]
                self.violate("memtile", what, t[key], cap, STAGES[1],
                             f"memory tile {worst} gets {', '.join(t['bufs'])} (L2 buffers dealt round-robin "
                             f"over {f.memtiles} memory tiles in program order)")

    def _held(self, pieces: int, launch_folded: int) -> int:
        """BD IDs a shim flow holds at once: its pieces for every launch iteration the runtime sequence issues
        before it waits (launch_window) that is not folded into the flow's BD (aie-assign-runtime-sequence-bd-ids
        fails with 'Allocator exhausted available buffer descriptor IDs' past the shim tile's 16: seen for the
        untiled 1x16-launch GEMM 64x2048x8192 through /work/tools/air-lower.sh, which lowers with tiling 2,2)."""
        window = launch_window(self.launch, self.preset.runtime_loop_tiling_sizes)
        return pieces * max(1, -(-window // max(1, launch_folded)))

    # ---- shim columns: the allocator walks the columns, two channels per direction each
    def _shim(self, flows: list[Flow]) -> None:
        f = self.facts
        u = self.usage
        per_col_bds = Counter()
        for direction, cap_col in (("MM2S", f.shim_mm2s), ("S2MM", f.shim_s2mm)):
            fl = sorted((x for x in flows if x.direction == direction), key=lambda x: x.line)
            for i, x in enumerate(fl):
                x.column = i // cap_col
                per_col_bds[x.column] += x.held or x.pieces
            total = len(fl)
            if direction == "MM2S":
                u.shim_mm2s = total
            else:
                u.shim_s2mm = total
            cap = f.columns * cap_col
            if total > cap:
                kinds = Counter(x.what for x in fl)
                top = ", ".join(f"{n} x {w}" for w, n in kinds.most_common(3))
                # air-to-aie's shim allocator runs out of MM2S channels ("out of shim dma channels"); per-tile
                # stores of a herd bundle reach airrt-to-npu ("failed to specialize channel bundle indices")
                stage = STAGES[1] if direction == "MM2S" else STAGES[2]
                self.violate("shim", f"{direction} channels", total, cap, stage,
                             f"{top} ({cap_col} per shim column x {f.columns} columns)", fl[cap].line)
        u.shim_bds = max(per_col_bds.values(), default=0)
        u.shim_tasks = sum(x.tasks for x in flows)
        for col, n in sorted(per_col_bds.items()):
            if n > f.shim_bds:
                heavy = max((x for x in flows if x.column == col), key=lambda x: x.held or x.pieces)
                if (heavy.held or heavy.pieces) > heavy.pieces:
                    why = (f"{heavy.what} holds {heavy.held} BDs: {heavy.held // heavy.pieces} launch iterations "
                           f"configured before the runtime sequence waits (runtime loop tiling recycles them)")
                else:
                    why = f"{heavy.what} needs {heavy.pieces} BDs per task (more than 4 dimensions after folding)"
                self.violate("shim", "BDs", n, f.shim_bds, STAGES[2], f"column {col}: {why}", heavy.line)
                break
        bad = [x for x in flows if x.non_affine]
        if bad:
            worst = max(bad, key=lambda x: x.tasks)
            self.violate("shim", "DMA offset", "div/rem", "affine", STAGES[4],
                         f"{worst.what}: the loop cannot fold into the BD's wrap/stride, {worst.tasks} DMA tasks "
                         f"per launch", worst.line, kind="rule")


def pingpong_copies(trip: int | None) -> int:
    """Copies air-ping-pong-transform makes of a buffer allocated in a labelled loop: two, and a third for an
    odd static trip count (the lowering toolchain's mlir-air unrolls the loop by two and gives the remainder
    iteration its own buffers: three copies of the GEMM's L1 A/W tiles overflowed L1 at k = 576 / 64 = 9
    steps, three copies of its L2 panels at 3 steps; mlir-air PR #2000 later stops labelling odd trip counts)."""
    return 3 if trip is not None and trip > 1 and trip % 2 else 2

def herd_name(h: Region) -> str:
    return f"@{h.symbol}" if h.symbol else "herd"


def _call_roles(node: Call) -> tuple[set[int], set[int]]:
    """(operand positions written, positions only written) of an external call; an unknown symbol is assumed
    to read every memref operand and to write its last one."""
    ec = external_cost(node.symbol)
    if ec is not None:
        return set(ec[0].writes), set(ec[0].pure_outputs)
    mem = [i for i, a in enumerate(node.args) if isinstance(a, Buffer)]
    return ({mem[-1]}, set()) if mem else (set(), set())


def _reads(node, buf: Buffer) -> bool:
    if isinstance(node, Compute):
        return buf in node.reads
    if isinstance(node, Call):
        _, pure = _call_roles(node)
        return any(a is buf and i not in pure for i, a in enumerate(node.args))
    if isinstance(node, Transfer):
        return node.src is not None and node.src.buffer is buf
    return False


def _writes(node, buf: Buffer) -> bool:
    if isinstance(node, Compute):
        return buf in node.writes
    if isinstance(node, Call):
        writes, _ = _call_roles(node)
        return any(a is buf and i in writes for i, a in enumerate(node.args))
    if isinstance(node, Transfer):
        return node.dst is not None and node.dst.buffer is buf
    return False


def analyze_launches(text: str, name: str | None = None, preset=None, facts: NPU2Facts = NPU2
                     ) -> tuple[str, list[LaunchReport]]:
    module = ir.parse(text)
    name = name or module.name
    preset = preset or presets_mod.preset_of_text(text)
    reports = [_LaunchAnalyzer(module, name, i, la, preset, facts).run() for i, la in enumerate(module.launches)]
    return name, reports
