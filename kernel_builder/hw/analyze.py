"""The resource analyzer: every launch of a module text checked against the NPU2 facts, counted the way
mlir-air's lowering allocates (docs/hardware-model.md, "What the analyzer counts").

Per launch: DMA channel endpoints on core tiles, memory tiles and shim columns; buffer descriptors per tile
(shim BDs after wrap/stride folding and runtime loop tiling); L1 and L2 peak bytes with ping-pong copies
where the transform applies and the core stack; transfer sizes, alignment and BD dimensions; the
air-dma-to-channel dominance pattern; non-affine shim offsets in loops; stack needs; and the work each herd
tile does (vector, matmul, scalar) for the cost model.

This module drives a launch (segments, herds, ping-pong copies, each herd tile's L1, stack, core channels
and work); `flows` accounts the DMA streams on shim columns and memory tiles, `checks` holds the
per-transfer limit checks.
"""
from __future__ import annotations

from collections import Counter

from kernel_builder import presets as presets_mod
from kernel_builder.external_costs import external_cost
from kernel_builder.hw import count as cnt
from kernel_builder.hw import ir
from kernel_builder.hw.facts import NPU2, NPU2Facts
from kernel_builder.hw.checks import TransferChecks
from kernel_builder.hw.flows import FlowAccounting
from kernel_builder.hw.ir import L1, L2, L3, Alloc, Buffer, Call, Compute, Loop, Region, Transfer
from kernel_builder.hw.operand_work import valued_work
from kernel_builder.hw.results import (AIECC, AIR_TO_AIE, PING_PONG, RUNTIME, STAGES, Flow,
                                       LaunchReport, Usage, Violation, Work)

# Which ping-pong rule decides the buffer copies: "all-loops" (the mlir-air the real-lowering toolchain
# pins, efeb41ce4, 2026-04) or "candidates" (mlir-air HEAD's isPingPongCandidate, 2026-08).
PINGPONG_RULE = "all-loops"

__all__ = ["analyze_launches", "STAGES", "Flow", "LaunchReport", "Usage", "Violation", "Work"]


def _unrolled_copies(lp) -> int:
    """Buffer copies after air-ping-pong-transform unrolls `lp` by 2 (scf loopUnrollByFactor): the unrolled
    body holds two, and a trip count that is odd (or not static) adds an epilogue iteration whose allocation
    is a third buffer (seen in the tool's output: gemv's 9-trip loop -> three 8x576 weight buffers)."""
    trip = cnt.static_trip(lp)
    return 2 if trip is not None and trip % 2 == 0 else 3


class _LaunchAnalyzer(TransferChecks, FlowAccounting):
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
        self.chan_cols: dict[tuple, set] = {}          # (channel, index) -> columns of the cores using it
        self.chan_l2: dict = {}                         # (channel, index) -> the L2 buffer of its segment side
        self.l2_tile: dict[Buffer, int] = {}          # L2 buffer -> the memory tile AIR places it on

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
        self.launch_level = {n for n in launch_paths if isinstance(n, Transfer)}   # unfolded loops: no waits
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
        allocs = [n.buffer for n in ir.walk(self.launch.body) if isinstance(n, Alloc) and n.buffer.space == L2]
        self._memtiles({b: mem_items[b] for b in allocs + list(mem_items) if b in mem_items})
        self._shim(shim_flows)
        self.work.flows = shim_flows
        if tile_work:
            counts, mm, sc, _, _ = max(tile_work, key=lambda w: w[3])   # the busiest tile by modeled cycles
            self.work.tile_counts, self.work.tile_matmul_macs, self.work.tile_scalar_ops = dict(counts), mm, sc
            self.work.tile_l1_in_bytes = max(w[4][0] for w in tile_work)
            self.work.tile_l1_out_bytes = max(w[4][1] for w in tile_work)
        return LaunchReport(self.index, self.launch_name, self.usage, self.work, self.violations)

    # ---- herds
    def _herd(self, herd: Region, launch_envs, flows: list, mem: dict) -> tuple:
        n_tiles = herd.n_instances
        self.usage.herd_tiles = max(self.usage.herd_tiles, n_tiles)
        paths = cnt.loop_paths(herd.body)
        self._pingpong(herd.body, L1)
        self._herd_channel_columns(herd, paths)
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
        self._herd_core(herd, paths, packet)   # L1, stack, core channels, BDs and locks
        self._pingpong_failure(herd, paths)
        # transfers: shim flows, memtile endpoints, checks
        # work
        for n, k in totals.items():
            if isinstance(n, Call):
                ec = external_cost(n.symbol)
                if ec is not None:
                    self.work.vector_macs += ec[0].work(ec[1], n.args).vector_macs * k
            elif isinstance(n, Compute):
                self.work.scalar_macs += n.macs * k
        return self._herd_work(herd, by_tile, paths)

    def _herd_core(self, herd: Region, paths: dict, packet) -> None:
        """A herd tile's L1, stack, core DMA channels, BDs and locks (identical on every tile of a herd) into the
        usage, with a violation for each over its limit; `packet`: the herd's packet-switched transfers."""
        f = self.facts
        l1 = sum(b.nbytes * self.copies.get(b, 1) for b in (n.buffer for n in paths if isinstance(n, Alloc))
                 if b.space == L1)
        stack_need = f.default_stack_bytes
        mm2s = s2mm = bds = 0
        packet_dirs: set[str] = set()  # packet flows of a core time-share one DMA channel per direction
        on_channel: set[tuple] = set()  # transfers on one channel share the core's DMA channel (mlir-air
        # AIRToAIESchedulingUtils.cpp DMAAllocator::allocNewDmaChannel reuses a tile's allocation of that channel)
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
                        shared = n.channel is not None and (n.channel, side) in on_channel
                        if n.channel is not None:
                            on_channel.add((n.channel, side))
                        if n in packet:
                            packet_dirs.add(side)
                        elif shared:
                            pass
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

    def _herd_work(self, herd: Region, by_tile: dict, paths: dict) -> tuple:
        """(counts, linalg.matmul MACs, scalar ops, likely cycles, (busiest L1 in, out bytes)) of the busiest tile."""
        # the busiest tile over the whole launch grid (launch iterations run in turn): its counted instructions
        # (external calls: kernel_builder/<kind>/external.py counts, + one "calls" each), linalg.matmul MACs,
        # scalar ops; the busiest L1 in / out stream bytes of any tile
        valued = [n for n in paths if isinstance(n, Call) and (ec := external_cost(n.symbol)) is not None
                  and ec[0].valued]   # work depends on operand values: evaluated per call (valued_work)
        tiles = []
        for runs in by_tile.values():
            counts: Counter = Counter()
            mm = sc = 0
            l1: Counter = Counter()   # (side, transfer) -> bytes: each L1 transfer is one core DMA stream
            for c, lmult in runs:
                for n, k in c.items():
                    k *= lmult
                    if isinstance(n, Call) and n not in valued:
                        ec = external_cost(n.symbol)
                        if ec is not None:
                            w = ec[0].work(ec[1], n.args)
                            for kind, v in w.counts.items():
                                counts[kind] += v * k
                            counts["calls"] += k
                            sc += w.scalar_ops * k
                    elif isinstance(n, Compute):
                        if n.kind == "matmul":
                            mm += n.macs * k
                        else:
                            sc += n.macs * k
                    elif isinstance(n, Transfer):
                        for side, acc in (("in", n.dst), ("out", n.src)):
                            if acc is not None and acc.buffer.space == L1:
                                l1[side, n] += acc.nbytes * k
            l1_in = max((b for (side, _), b in l1.items() if side == "in"), default=0)
            l1_out = max((b for (side, _), b in l1.items() if side == "out"), default=0)
            tiles.append([counts, mm, sc, (l1_in, l1_out)])
        if not tiles:
            tiles.append([Counter(), 0, 0, (0, 0)])
        for n in valued:   # the herd's tiles run in step: added to every tile (valued_work takes the busiest)
            vc, vsc = valued_work(self.launch, herd, n, paths[n], self.m.ranges)
            for tw in tiles:
                tw[0] = tw[0] + vc
                tw[2] += vsc
        from kernel_builder.hw import cost
        best = max(tiles, key=lambda tw: cost.compute_cycles(
            cost.work_counts(Work(tile_counts=tw[0], tile_matmul_macs=tw[1], tile_scalar_ops=tw[2]))))
        counts, mm, sc, l1 = best
        cycles = cost.compute_cycles(cost.work_counts(Work(tile_counts=counts, tile_matmul_macs=mm,
                                                           tile_scalar_ops=sc)))
        return counts, mm, sc, cycles, (max(tw[3][0] for tw in tiles), max(tw[3][1] for tw in tiles))

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


def _owner(path) -> Loop | None:
    """The loop a node sits in once canonicalization has removed loops of one static trip."""
    loops = [lp for lp in path if cnt.static_trip(lp) != 1]
    return loops[-1] if loops else None


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
