"""What the analyzer reports: violations (one line each), shim flows, resource usage and work per launch."""
from __future__ import annotations

from dataclasses import dataclass, field

# The lowering stages in the order aircc runs them (the first violation is the one the real compile meets).
DMA_TO_CHANNEL, PING_PONG, AIR_TO_AIE, AIRRT_TO_NPU, AIECC, RUNTIME = (
    "air-dma-to-channel", "air-ping-pong-transform", "air-to-aie", "airrt-to-npu", "aiecc", "runtime")
STAGES = (DMA_TO_CHANNEL, PING_PONG, AIR_TO_AIE, AIRRT_TO_NPU, AIECC, RUNTIME)


@dataclass
class Violation:
    module: str
    launch: int
    launch_name: str
    tile: str            # "core" | "memtile" | "shim"
    resource: str        # e.g. "S2MM channels", "L1 bytes", "DMA transfer bytes"
    used: object
    available: object
    stage: str           # the lowering stage that would reject it (STAGES)
    kind: str            # "resource" (a chip limit) | "rule" (a pattern the lowering or the chip mishandles)
    detail: str
    line: int = 0

    def one_line(self) -> str:
        where = f" (line {self.line})" if self.line else ""
        if isinstance(self.used, int) and isinstance(self.available, int):
            amount = f"{self.used}/{self.available}"
        else:
            amount = f"({self.used}; needs {self.available})"
        return (f"{self.module}: launch {self.launch} ({self.launch_name}): {self.tile} {self.resource} "
                f"{amount} - {self.detail}{where}")

    __str__ = one_line


@dataclass
class Flow:
    """One shim DMA channel endpoint (a data stream between DDR and the array)."""
    direction: str       # "MM2S" (DDR -> array) | "S2MM" (array -> DDR)
    line: int
    what: str
    bytes: int           # over the whole launch
    tasks: int           # DMA tasks (BD chains) issued over the whole launch
    pieces: int          # BDs the flow holds at once: launch iterations its BD cannot fold, issued before a wait
    non_affine: bool = False
    column: int = -1
    leak: int = 0        # BDs its tasks leave allocated to the end of the runtime sequence (dma.wrap_split)
    l2: object = None    # the L2 buffer on the other side of a segment DMA: the shim allocator starts at its memory
                         # tile's column (mlir-air ShimDMAAllocator "same_column"); None: packed in program order
    note: str = ""       # why its loops stayed unfolded (dma.ShimTask.note), quoted when its BDs run out


@dataclass
class Usage:
    """Resources one launch uses: per core tile / per memory tile the busiest one, totals where the
    resource is pooled (shim channels), and the busiest shim column's BDs."""
    herd_tiles: int = 0
    core_mm2s: int = 0
    core_s2mm: int = 0
    core_bds: int = 0
    core_locks: int = 0
    l1_bytes: int = 0            # busiest core: buffers (with ping-pong copies) + stack
    stack_bytes: int = 0
    stack_need: int = 0
    memtile_mm2s: int = 0        # total over the memory tiles
    memtile_s2mm: int = 0
    memtile_bds: int = 0
    memtiles: int = 0            # memory tiles the L2 buffers need
    l2_bytes: int = 0            # total L2 (with ping-pong copies)
    shim_mm2s: int = 0
    shim_s2mm: int = 0
    shim_bds: int = 0            # busiest shim column
    shim_bds_by_column: dict = field(default_factory=dict)   # BDs held at once per shim column
    shim_leak: dict = field(default_factory=dict)   # per shim column: BDs left allocated after the launch
    seq_bds_by_column: dict = field(default_factory=dict)   # the two above under the tool's own placement of the
    seq_leak: dict = field(default_factory=dict)            # segment DMAs (their memory tile's column): what the
                                                            # module's runtime sequence adds up (sequence_bd_leaks)
    shim_tasks: int = 0

    def merge_max(self, other: "Usage") -> "Usage":
        def mx(a, b):
            return {c: max(a.get(c, 0), b.get(c, 0)) for c in {*a, *b}} if isinstance(a, dict) else max(a, b)
        return Usage(**{k: mx(getattr(self, k), getattr(other, k)) for k in self.__dataclass_fields__})


@dataclass
class Work:
    """What the cost model needs: the busiest herd tile's work and the shim streams."""
    tile_counts: dict = field(default_factory=dict)   # the busiest tile's counted instructions of external calls
                                                      # by kind (kernel_builder.instr_counts) + "calls"
    tile_matmul_macs: int = 0         # linalg.matmul MACs (lowered to scalar loops by aircc today)
    tile_scalar_ops: int = 0          # scalar float ops (codegen loops, linalg.generic/fill, externals' scalar part)
    tile_l1_in_bytes: int = 0         # the busiest tile's busiest stream into L1 (one core S2MM channel)
    tile_l1_out_bytes: int = 0        # ... out of L1 (one core MM2S channel)
    vector_macs: int = 0              # totals over the launch
    scalar_macs: int = 0
    flows: list[Flow] = field(default_factory=list)
    launch_iterations: int = 1
    l2_placement: list = field(default_factory=list)   # per memory tile: the L2 buffers AIR places on it

    @property
    def tile_mmul_macs(self) -> int:
        """Matrix-unit MACs of the busiest tile in block-float mode: 512 per 8x8x8 instruction (a 4x8x8 under the
        flag occupies a whole instruction); the cost model reads the instruction counts, not this."""
        return 512 * self.tile_counts.get("mmul_bfp16_8x8x8", 0)

    @property
    def tile_mmul_emulated_macs(self) -> int:
        """... of a bf16 aie::mmul<4, 8, 8> compiled without the block-float flag (256 each, emulated)."""
        return 256 * self.tile_counts.get("mmul_bf16_4x8x8_emulated", 0)

    @property
    def scalar_share(self) -> float:
        total = self.vector_macs + self.scalar_macs
        return self.scalar_macs / total if total else 0.0


@dataclass
class LaunchReport:
    index: int
    name: str
    usage: Usage
    work: Work
    violations: list[Violation]
    modeled_ms: float = 0.0
