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
from kernel_builder.hw.dma import canonical_dims, is_contiguous, iteration_space, linear_offset, shim_fold
from kernel_builder.hw.ir import L1, L2, L3, Access, Alloc, Buffer, Call, Compute, Loop, Region, Transfer
from kernel_builder.hw.valued import valued_work
from kernel_builder.hw.results import (AIECC, AIR_TO_AIE, AIRRT_TO_NPU, PING_PONG, RUNTIME, STAGES, Flow,
                                       LaunchReport, Usage, Violation, Work)

# Which ping-pong rule decides the buffer copies: "all-loops" (the mlir-air the lowering toolchain under
# /work/tools builds, 2026-04) or "candidates" (mlir-air HEAD's isPingPongCandidate, 2026-08).
PINGPONG_RULE = "all-loops"

__all__ = ["analyze_launches", "STAGES", "Flow", "LaunchReport", "Usage", "Violation", "Work"]


def _unrolled_copies(lp) -> int:
    """Buffer copies after air-ping-pong-transform unrolls `lp` by 2 (scf loopUnrollByFactor): the unrolled
    body holds two, and a trip count that is odd (or not static) adds an epilogue iteration whose allocation
    is a third buffer (seen in the tool's output: gemv's 9-trip loop -> three 8x576 weight buffers)."""
    trip = cnt.static_trip(lp)
    return 2 if trip is not None and trip % 2 == 0 else 3


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
        self.channel_flows: dict[tuple, Flow] = {}   # (direction, channel, index) -> its one shim flow

    @staticmethod
    def _regions(block):
        return [n for n in ir.walk(block) if isinstance(n, Region)]

    def violate(self, tile, resource, used, available, stage, detail, line=0, kind="resource"):
        self.violations.append(Violation(self.name, self.index, self.launch_name, tile, resource, used, available,
                                         stage, kind, detail, line))

    # ---- ping-pong
    def _pingpong_on(self, space: int) -> bool:
        omit = self.preset.omit_pingpong
        return not (omit == "all" or (omit == "L1" and space == L1) or (omit == "L2" and space == L2))

    def _pingpong(self, block, space: int) -> None:
        """Copies of each buffer allocated in `block` (air-label-scf-for-to-ping-pong + air-ping-pong-transform).
        A loop that allocates directly in its body (loops of one static trip are gone by then) is labelled and
        unrolled by 2, so each of its buffers gets two copies (three when the trip count is odd or unknown:
        the unroll's epilogue iteration allocates its own) - unless the preset omits ping-pong for a memory
        space the loop allocates in. That is the rule of the mlir-air the lowering toolchain builds (and what
        its buffers show); with PINGPONG_RULE = "candidates" the model applies mlir-air HEAD's stricter
        `isPingPongCandidate` instead: a loop is labelled only when each buffer it allocates is first accessed
        by a definite write (a transfer into it, a store, a write-only linalg op; an external call may read),
        and no loop nested in it is disqualified."""
        paths = cnt.loop_paths(block)
        owner = {n: _owner(p) for n, p in paths.items() if isinstance(n, Alloc)}
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

        def labelled(lp) -> bool:
            allocs = by_loop.get(lp, [])
            if not allocs or not all(self._pingpong_on(a.buffer.space) for a in allocs):
                return False
            if PINGPONG_RULE != "candidates":
                return True
            if unsafe(lp):
                return False
            return not any(n is not lp and isinstance(n, Loop) and cnt.static_trip(n) != 1 and unsafe(n)
                           for n in ir.walk(lp.body))

        verdict = {lp: labelled(lp) for lp in by_loop if lp is not None}
        for a, lp in owner.items():
            if a.buffer.space == space:
                self.copies[a.buffer] = _unrolled_copies(lp) if lp is not None and verdict[lp] else 1

    # ---- main
    def run(self) -> LaunchReport:
        launch_env_list = cnt.region_instances(self.launch, {})
        # DDR buffers written by more than one transfer of the launch: their writes are chained by
        # write-after-write dependencies and do not fold the launch grid (dma.shim_fold)
        writers = Counter(n.dst.buffer for n in ir.walk(self.launch.body)
                          if isinstance(n, Transfer) and n.dst is not None and n.dst.buffer.space == L3)
        self.chained_writes = {b for b, c in writers.items() if c > 1}
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
                in_flight, folded, non_affine, stride, ndims = shim_fold(
                    acc, path, self.launch, self.preset.runtime_loop_tiling_sizes, self.facts,
                    chained_write=inbound and acc.buffer in self.chained_writes)
                self._check_shim_access(t, acc, stride, ndims)
                flow = Flow("S2MM" if inbound else "MM2S", t.line, f"{t.kind} {acc.buffer.name}",
                            acc.nbytes * execs, max(1, execs // max(1, folded)), in_flight, non_affine)
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
                    same.non_affine = same.non_affine or flow.non_affine
                    if acc.buffer.name not in same.what:
                        same.what += f" + {acc.buffer.name}"
                    continue
                if key:
                    self.channel_flows[key] = flow
                flows.append(flow)
            elif acc.buffer.space == L2:
                item = mem.setdefault(acc.buffer, {"s2mm": 0, "mm2s": 0, "bds": 0, "line": t.line})
                item["s2mm" if inbound else "mm2s"] += 1
                item["bds"] += self.copies.get(acc.buffer, 1)

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
        # DDR streams first: whether they are packet-switched decides how many core DMA channels they take
        bundles: list = []
        for t in [n for n in paths if isinstance(n, Transfer)]:
            self._herd_transfer(herd, t, paths[t], per_tile, totals, bundles, mem)
        packet = self._herd_streams(herd, bundles, flows)
        # L1, stack, core channels and BDs (identical on every tile of a herd)
        l1 = sum(b.nbytes * self.copies.get(b, 1) for b in (n.buffer for n in paths if isinstance(n, Alloc))
                 if b.space == L1)
        stack_need = f.default_stack_bytes
        mm2s = s2mm = bds = 0
        packet_dirs: set[str] = set()  # packet flows of a core time-share one DMA channel per direction
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
                        if n in packet:
                            packet_dirs.add(side)
                        elif side == "dst":
                            s2mm += 1
                        else:
                            mm2s += 1
                        bds += self.copies.get(acc.buffer, 1)
                        locked.add(acc.buffer)
        s2mm += "dst" in packet_dirs
        mm2s += "src" in packet_dirs
        u = self.usage
        u.l1_bytes = max(u.l1_bytes, l1 + self.preset.stack_size)
        u.stack_need = max(u.stack_need, stack_need)
        u.core_mm2s, u.core_s2mm = max(u.core_mm2s, mm2s), max(u.core_s2mm, s2mm)
        u.core_bds = max(u.core_bds, bds)
        u.core_locks = max(u.core_locks, 2 * len(locked))
        hname = f"herd @{herd.symbol}" if herd.symbol else "herd"
        if s2mm > f.core_s2mm:
            self.violate("core", "S2MM channels", s2mm, f.core_s2mm, AIR_TO_AIE,
                         f"each tile of {hname} receives {s2mm} streams (one DMA channel per stream)", herd.line)
        if mm2s > f.core_mm2s:
            self.violate("core", "MM2S channels", mm2s, f.core_mm2s, AIR_TO_AIE,
                         f"each tile of {hname} sends {mm2s} streams", herd.line)
        if l1 + self.preset.stack_size > f.core_memory_bytes:
            parts = ", ".join(f"{b.name} {b.nbytes}x{self.copies.get(b, 1)}" for b in
                              (n.buffer for n in paths if isinstance(n, Alloc)) if b.space == L1)
            self.violate("core", "L1 bytes", l1 + self.preset.stack_size, f.core_memory_bytes, AIECC,
                         f"{hname}: {parts} + stack {self.preset.stack_size} (ping-pong copies counted)", herd.line)
        if bds > f.core_bds:
            self.violate("core", "BDs", bds, f.core_bds, AIECC, f"{hname}: one BD per transfer and buffer copy",
                         herd.line)
        if 2 * len(locked) > f.core_locks:
            self.violate("core", "locks", 2 * len(locked), f.core_locks, AIR_TO_AIE, f"{hname}: two per DMA'd buffer",
                         herd.line)
        if stack_need > self.preset.stack_size:
            self.violate("core", "stack bytes", stack_need, self.preset.stack_size, RUNTIME,
                         f"{hname} calls soft-float division (scalar divf/rsqrt or an external kernel's "
                         f"scalar division); raise aircc --stack-size", herd.line, kind="rule")
        self._pingpong_failure(herd, paths)
        # transfers: shim flows, memtile endpoints, checks
        # work
        best = (0.0, 0, 0, 0, 0)   # the busiest tile over the whole launch grid (launch iterations run in turn)
        valued = [n for n in paths if isinstance(n, Call) and (ec := external_cost(n.symbol)) is not None
                  and ec[0].valued]   # work depends on operand values: evaluated per call (_valued_work)
        for runs in by_tile.values():
            vec = mm = sc = sc_ = mmul = 0
            for c, lmult in runs:
                for n, k in c.items():
                    k *= lmult
                    if isinstance(n, Call) and n not in valued:
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
        for n in valued:
            best = tuple(a + b for a, b in zip(best, valued_work(self.launch, herd, n, paths[n], self.m.ranges)))
        for n, k in totals.items():
            if isinstance(n, Call):
                ec = external_cost(n.symbol)
                if ec is not None:
                    self.work.vector_macs += ec[0].work(ec[1], n.args).vector_macs * k
            elif isinstance(n, Compute):
                self.work.scalar_macs += n.macs * k
        return best

    def _pingpong_failure(self, herd: Region, paths: dict) -> None:
        """air-ping-pong-transform fails with "operand #0 does not dominate this use" on a loop it labels
        (it allocates) whose trip count is not static (a bound depends on a tile id or an outer iv) when a
        loop nested in it, also labelled, loads data shared by several tiles (AIR's broadcast detection wraps
        that load in an affine.if): observed on today's flash attention and a hand-written reduction of it
        (docs/hardware-model.md)."""
        if not self._pingpong_on(L1):
            return
        labelled = {lp for lp in paths if isinstance(lp, Loop) and cnt.static_trip(lp) != 1
                    and any(isinstance(n, Alloc) and n.buffer.space == L1 and _owner(paths[n]) is lp for n in paths)}
        for outer in labelled:
            if cnt.static_trip(outer) is not None:
                continue
            for inner in labelled:
                if inner is outer or outer not in paths[inner]:
                    continue
                for t in ir.walk(inner.body):
                    if isinstance(t, Transfer) and t.kind == "dma" and t.dst is not None and \
                            t.dst.buffer.space == L1 and t.src is not None and self._shared(herd, t.src) > 1:
                        self.violate("core", "ping-pong", "broadcast load in a nested loop",
                                     "static trip count of the outer loop", PING_PONG,
                                     f"the loop at line {outer.line} (trip count not static) and the loop at line "
                                     f"{inner.line} are both ping-ponged and {t.dst.buffer.name} is loaded once for "
                                     f"several tiles: air-ping-pong-transform fails with 'operand #0 does not "
                                     f"dominate this use' (--omit-ping-pong-transform=L1 avoids it)", t.line,
                                     kind="rule")
                        return

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
                in_flight, folded, non_affine, stride, ndims = shim_fold(
                    acc, path, self.launch, self.preset.runtime_loop_tiling_sizes, f,
                    chained_write=not inbound_to_core and acc.buffer in self.chained_writes)
                self._check_shim_access(t, acc, stride, ndims)
                per_tile_execs = execs / n_tiles  # averaged over the tiles (a causal herd is uneven)
                what = f"{'load' if inbound_to_core else 'store'} {acc.buffer.name} by {herd_name(herd)}" + \
                    (f" (shared by {shared} tiles)" if inbound_to_core and shared > 1 else "")
                bundles.append(dict(transfer=t, direction="MM2S" if inbound_to_core else "S2MM", line=t.line, what=what,
                                    groups=groups, broadcast=shared > 1, bytes=int(acc.nbytes * per_tile_execs),
                                    tasks=max(1, int(per_tile_execs) // max(1, folded)), in_flight=in_flight,
                                    non_affine=non_affine))
            else:
                item = mem.setdefault(acc.buffer, {"s2mm": 0, "mm2s": 0, "bds": 0, "line": t.line})
                item["mm2s" if inbound_to_core else "s2mm"] += groups
                item["bds"] += groups * self.copies.get(acc.buffer, 1)

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
                for _ in range(cols):
                    flows.append(Flow(direction, bs[0]["line"], what, total_bytes // cols,
                                      max(1, total_tasks // cols), max(1, in_flight),
                                      any(b["non_affine"] for b in bs)))
                packet |= {b["transfer"] for b in bs}
                continue
            for b in bs:
                for _ in range(b["groups"]):
                    flows.append(Flow(direction, b["line"], b["what"], b["bytes"], b["tasks"], b["in_flight"],
                                      b["non_affine"]))
        return packet

    def _check_shim_access(self, t: Transfer, acc: Access, stride: int, ndims: int) -> None:
        limit = self.facts.shim_bd_max_stride
        if stride * acc.buffer.type.elem_bytes // self.facts.transfer_granularity_bytes > limit:
            self.violate("shim", "BD stride", stride, limit, AIRRT_TO_NPU,
                         f"{acc.buffer.name}: a stride of {stride} elements after folding the enclosing loops "
                         f"exceeds the shim BD's 20-bit step (in 32-bit words)", t.line)
        if ndims > self.facts.shim_bd_dims:
            self.violate("shim", "BD dimensions", ndims, self.facts.shim_bd_dims, AIRRT_TO_NPU,
                         f"{acc.buffer.name}: airrt lowering keeps the innermost {self.facts.shim_bd_dims} dims of a "
                         f"DDR access and drops the others (the transfer compiles and moves less data)", t.line,
                         kind="rule")

    # ---- transfer checks (one side)
    def _check_side(self, t: Transfer, acc: Access, tile: str, loops: tuple[Loop, ...] = ()) -> None:
        f = self.facts
        g = f.transfer_granularity_bytes
        eb = acc.buffer.type.elem_bytes
        stage = AIRRT_TO_NPU if tile == "shim" else AIR_TO_AIE
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
                self.violate(tile, "BD dimensions", len(dims), max_dims, AIR_TO_AIE,
                             f"{acc.buffer.name}: access pattern {dims}", t.line)
            for s, st in dims:
                if s > f.bd_max_size or st > f.bd_max_stride:
                    self.violate(tile, "BD wrap/stride", f"{s}/{st}", f"{f.bd_max_size}/{f.bd_max_stride}",
                                 AIR_TO_AIE, f"{acc.buffer.name}: access pattern {dims}", t.line)
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
                self.violate("memtile", "L2 bytes", it["bytes"], f.memtile_bytes, AIECC,
                             f"{buf.name} ({buf.nbytes} B x {self.copies.get(buf, 1)} copies) exceeds one memory tile",
                             it["line"])
                continue
            parts = max(1, -(-it["mm2s"] // f.memtile_mm2s), -(-it["s2mm"] // f.memtile_s2mm),
                        -(-it["bds"] // f.memtile_bds))
            for _ in range(parts):
                pieces.append((buf, {key: -(-it[key] // parts) for key in ("mm2s", "s2mm", "bds", "bytes")}))
        tiles = [{"mm2s": 0, "s2mm": 0, "bds": 0, "bytes": 0, "bufs": []} for _ in range(min(f.memtiles, len(pieces)))]
        for i, (buf, piece) in enumerate(pieces):
            t = tiles[i % f.memtiles]
            for key in piece:
                t[key] += piece[key]
            t["bufs"].append(buf.name)
        u.memtiles = len(tiles)
        for key, what, cap in (("s2mm", "S2MM channels", f.memtile_s2mm), ("mm2s", "MM2S channels", f.memtile_mm2s),
                               ("bds", "BDs", f.memtile_bds), ("bytes", "L2 bytes", f.memtile_bytes)):
            worst = max(range(len(tiles)), key=lambda i: tiles[i][key], default=None)
            if worst is not None and tiles[worst][key] > cap:
                t = tiles[worst]
                self.violate("memtile", what, t[key], cap, AIR_TO_AIE if key != "bytes" else AIECC,
                             f"memory tile {worst} gets {', '.join(t['bufs'])} (L2 buffers dealt round-robin "
                             f"over {f.memtiles} memory tiles in program order)")

    # ---- shim columns: the allocator walks the columns, two channels per direction each
    def _shim(self, flows: list[Flow]) -> None:
        f = self.facts
        u = self.usage
        per_col_bds = Counter()
        for direction, cap_col in (("MM2S", f.shim_mm2s), ("S2MM", f.shim_s2mm)):
            fl = sorted((x for x in flows if x.direction == direction), key=lambda x: x.line)
            for i, x in enumerate(fl):
                x.column = i // cap_col
                per_col_bds[x.column] += x.pieces
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
        u.shim_tasks = sum(x.tasks for x in flows)
        for col, n in sorted(per_col_bds.items()):
            if n > f.shim_bds:
                heavy = max((x for x in flows if x.column == col), key=lambda x: x.pieces)
                self.violate("shim", "BDs", n, f.shim_bds, AIECC,
                             f"column {col}: {heavy.what} keeps {heavy.pieces} DMA tasks in flight (one per transfer on "
                             f"its channel index and per launch iteration its BD cannot fold, issued before any "
                             f"wait; runtime loop tiling recycles BDs per tile)", heavy.line)
                break
        bad = [x for x in flows if x.non_affine]
        if bad:
            worst = max(bad, key=lambda x: x.tasks)
            self.violate("shim", "DMA offset", "div/rem", "affine", AIRRT_TO_NPU,
                         f"{worst.what}: air-opt-shim-dma-bds cannot fold a div/rem offset ('unknown ssa offset "
                         f"producer, NYI'); the lowering then repeats one transfer instead of walking the loop "
                         f"(wrong data) or fails to legalize the shim DMA", worst.line, kind="rule")


def _owner(path) -> Loop | None:
    """The loop a node sits in once canonicalization has removed loops of one static trip."""
    loops = [lp for lp in path if cnt.static_trip(lp) != 1]
    return loops[-1] if loops else None


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
