"""NPU2 (AIE2P, mlir-aie device `npu2`) facts: ONE table, every figure with its source.

Sources (paths in mlir-aie / mlir-air, as read for docs/hardware-model.md, which repeats this table):
- TM.h   = mlir-aie include/aie/Dialect/AIE/IR/AIETargetModel.h   (AIE2TargetModel, BaseNPU2TargetModel,
                                                                      NPU2TargetModel)
- TM.cpp = mlir-aie lib/Dialect/AIE/IR/AIETargetModel.cpp          (switchbox / shim-mux connection counts)
- AIEDialect.cpp, AIEXDialect.cpp = mlir-aie lib/Dialect/AIE[X]/IR (DMA BD and npu.dma_memcpy_nd verifiers)
- AssignBuffers = mlir-aie lib/Dialect/AIE/Transforms/AIEAssignBuffers.cpp (stack at address 0, then buffers)
- Sched = mlir-air lib/Conversion/AIRToAIESchedulingUtils.cpp (shim_dma_channels = 2, column walk)
- aircc = mlir-air tools/aircc/aircc.cpp (--stack-size default 1024); xrt.py = mlir-air
  python/air/backend/xrt.py ("scalar fdiv needs ~1152 bytes")
- linalg.py = mlir-aie python/iron/kernels/linalg.py `_MM_MAC_DIMS["aie2p"]` (bf16 mmul 4x8x8; 8x8x8 with the
  BFP16 emulation); UG1603 = AMD AI Engine-ML Kernel and Graph Programming Guide (memory tile: 6 MM2S + 6 S2MM
  DMA channels, 512 KB; the scalar unit has no floating-point hardware)
- guide = the 1B-model NPU2 implementation guide of mlir-air's llama32_1b example (B5: ~100 us per xrt.run)
- amdxdna driver = AMD's NPU kernel driver (drivers/accel/amdxdna: npu4_regs.c DPM clock table, aie2_smu.c TOPS)
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields

KiB = 1024


def _f(value, source: str):
    return field(default=value, metadata={"source": source})


@dataclass(frozen=True)
class NPU2Facts:
    # ---- array geometry
    device: str = _f("npu2", "aircc --device npu2; TM.h NPU2TargetModel")
    columns: int = _f(8, "TM.h NPU2TargetModel::columns() = 8")
    rows: int = _f(6, "TM.h BaseNPU2TargetModel::rows() = 6 (1 shim row, 1 memtile row, 4 core rows)")
    shim_row: int = _f(0, "TM.h BaseNPU2TargetModel::getTileType: row 0 = ShimNOCTile")
    memtile_row: int = _f(1, "TM.h BaseNPU2TargetModel::getTileType: row 1 = MemTile")
    core_rows: int = _f(4, "TM.h BaseNPU2TargetModel::getTileType: rows 2..5 = CoreTile")
    # ---- DMA channels per tile per direction (MM2S = memory to stream, S2MM = stream to memory)
    core_mm2s: int = _f(2, "TM.cpp AIE2TargetModel::getNumSourceSwitchboxConnections(core, DMA) = 2")
    core_s2mm: int = _f(2, "TM.cpp AIE2TargetModel::getNumDestSwitchboxConnections(core, DMA) = 2")
    memtile_mm2s: int = _f(6, "TM.cpp getNumSourceSwitchboxConnections(memtile, DMA) = 6; UG1603")
    memtile_s2mm: int = _f(6, "TM.cpp getNumDestSwitchboxConnections(memtile, DMA) = 6; UG1603")
    shim_mm2s: int = _f(2, "TM.cpp getNumSourceShimMuxConnections(shim, DMA) = 2; Sched shim_dma_channels = 2")
    shim_s2mm: int = _f(2, "TM.cpp getNumDestShimMuxConnections(shim, DMA) = 2; Sched shim_dma_channels = 2")
    # ---- buffer descriptors
    core_bds: int = _f(16, "TM.h AIE2TargetModel::getNumBDs = 16 for non-memtile tiles")
    shim_bds: int = _f(16, "TM.h AIE2TargetModel::getNumBDs = 16 for non-memtile tiles")
    memtile_bds: int = _f(48, "TM.h AIE2TargetModel::getNumBDs(MemTile) = 48")
    memtile_bds_per_channel: int = _f(24, "TM.h isBdChannelAccessible: even channels BDs 0-23, odd 24-47")
    core_bd_dims: int = _f(3, "AIEDialect.cpp DMABDOp::verify: at most 3 dimensions (4 on a MemTileDMAOp)")
    memtile_bd_dims: int = _f(4, "AIEDialect.cpp DMABDOp::verify: maxNDims = 4 in a MemTileDMAOp")
    shim_bd_dims: int = _f(4, "mlir-air AIRRtToNpuPass.cpp AIE2_DIM_COUNT: higher dims are unrolled into BDs")
    bd_max_size: int = _f(512, "AIEDialect.cpp DMABDOp::verify rejects a dim size >= (1 << 9) + 1 (core and memtile "
                              "BDs; the message says 'Size may not exceed 1023'); contiguous accesses are exempt")
    bd_max_stride: int = _f((1 << 19) - 1, "AIEDialect.cpp DMABDOp::verify rejects a stride >= (1 << 19) (message "
                                           "'Stride may not exceed 1048576')")
    shim_bd_max_size: int = _f(1023, "AIEXDialect.cpp verifyStridesWraps: shim wrap_bits = 10 ('Size 0/1 exceeds "
                                     "the [0:1023] range'); linear contiguous transfers are exempt")
    air_dma_max_size: int = _f(1023, "mlir-air AIRDependencyScheduleOpt.cpp: air-opt-shim-dma-bds "
                                     "(applyAIRL3DmaFoldingPatterns) and air-opt-memtile-dma-bds fold loops with "
                                     "maxSize = 1023 on AIE2 (elements of the memref's type); Util.cpp "
                                     "canonicalizeWrapAndStrideList splits a larger dim into (outer, inner = its "
                                     "largest factor <= 1023) and merges neighbours only within it; a contiguous "
                                     "access (isDefaultDataAccessPattern) is exempt")
    shim_bd_max_stride: int = _f(1 << 20, "AIEXDialect.cpp verifyStridesWraps: shim step_bits = 20")
    bd_max_repeat: int = _f(64, "AIEXDialect.cpp verifyStridesWraps: iter_bits = 6, 'Size 3 exceeds the [1:64] range'")
    transfer_granularity_bytes: int = _f(4, "TM.h getAddressGenGranularity() = 32 bits; AIEDialect.cpp 'transfer "
                                            "length must be multiple of 4'; AIEXDialect.cpp 'Transfer sizes must "
                                            "be multiples of 4 bytes', 'Offset must be 4-byte-aligned'")
    # ---- memories and locks
    core_memory_bytes: int = _f(64 * KiB, "TM.h getLocalMemorySize() = 0x10000 (stack included: AssignBuffers)")
    memtile_bytes: int = _f(512 * KiB, "TM.h getMemTileSize() = 0x80000; UG1603 512 KB")
    core_locks: int = _f(16, "TM.h AIE2TargetModel::getNumLocks = 16 for non-memtile tiles")
    memtile_locks: int = _f(64, "TM.h AIE2TargetModel::getNumLocks(MemTile) = 64")
    default_stack_bytes: int = _f(1024, "aircc --stack-size default 1024; AIRToAIE stack-size option default 1024")
    soft_float_div_stack_bytes: int = _f(1152, "xrt.py docstring: 'scalar fdiv needs ~1152 bytes'")
    # ---- compute
    bf16_mmul_shape: tuple = _f((4, 8, 8), "linalg.py _MM_MAC_DIMS['aie2p'][bf16] = (4, 8, 8)")
    bf16_mmul_macs_per_cycle: int = _f(256, "one 4x8x8 bf16 mmul per cycle (linalg.py shape; one vector op per "
                                           "VLIW bundle, UG1603)")
    vector_lanes_bf16: int = _f(32, "512-bit vector register = 32 bf16 lanes (UG1603 native vector size)")
    vector_lanes_f32: int = _f(16, "512-bit vector register = 16 f32 lanes (UG1603 native vector size)")
    bfp16_mmul_shape: tuple = _f((8, 8, 8), "linalg.py _MM_MAC_DIMS['aie2p']: 8x8x8 with the BFP16 emulation "
                                           "(AIE_API_EMULATE_BFLOAT16_MMUL_WITH_BFP16)")
    int8_macs_per_cycle: int = _f(512, "amdxdna driver aie2_smu.c NPU4_DPM_TOPS = 4096 x columns x H-clock (MHz) / 1e6: "
                                       "4096 int8 ops per column per cycle = 4 cores x 512 MACs x 2")
    aie_clock_max_hz: float = _f(1.8e9, "amdxdna driver npu4_regs.c npu4_dpm_clk_table: top DPM level H-clock 1800 MHz "
                                        "(MP-NPU clock 1267), the clock NPU4_DPM_TOPS multiplies; npu5 (Krackan) uses "
                                        "the same table; aie2_pm.c: power mode turbo (xrt-smi --pmode turbo) selects "
                                        "max_dpm_level")
    bfp16_gemm_tflops_measured: tuple = _f(
        ((1, 24.3, 27.33), (2, 31.3, 31.58), (3, 28.5, 28.6)),
        "mlir-aie programming_examples/ml/block_datatypes/gemm_asymmetric_tile_buffering/README.md 'Performance' "
        "(the designs of arXiv 2511.16041): (config, Strix Point, Krackan Point) whole-GEMM TFLOPS on 32 cores, "
        "--pmode turbo, best of 20 runs; config 1 bf16 A x bfp16 B 4096x4096x2048, config 2 bfp16 x bfp16 "
        "3072x4096x1536, config 3 bfp16 x bfp16 (bf16 accumulation) 4096x4096x2048; chess-compiled kernels")
    scalar_float_hw: bool = _f(False, "AM020/UG1603: the scalar unit has no floating-point hardware (emulation)")
    # ---- dispatch and hardware contexts
    dispatch_overhead_s: float = _f(100e-6, "guide B5: each xrt.run() has ~100 us fixed overhead")
    hw_contexts: int = _f(16, "amdxdna driver hwctx_limit = 16 for the npu2 family; mlir-aie PR #3526 lowered "
                              "its npu2 context cache to 16")
    hw_contexts_comfortable: int = _f(10, "mlir-air smolvla docs/profile.md: a process loading ~10+ ELFs starts "
                                          "failing CREATE_HWCTX / timing out")
    core_task_max_repeats: int = _f(256, "aie-rt XAie_DmaChannelSetStartQueue: RepeatCount <= MaxRepeatCount = 256 "
                                         "(driver/src/global/xaie2pgbl_reginit.c)")
    bd_max_repeat_count: int = _f(255, "AIEXDialect.cpp NpuPushQueueOp::verify: 'Repeat count exceeds the [0:255] "
                                       "range'; kernel_registry GEMV page: 'the 255 buffer-descriptor repeat-count "
                                       "limit' (mlir-air programming_examples/kernel_registry)")

    @property
    def core_tiles(self) -> int:
        return self.columns * self.core_rows

    @property
    def memtiles(self) -> int:
        return self.columns

    @property
    def shim_mm2s_total(self) -> int:
        return self.columns * self.shim_mm2s

    @property
    def shim_s2mm_total(self) -> int:
        return self.columns * self.shim_s2mm

    def sources(self) -> dict[str, tuple[object, str]]:
        """{field: (value, source)} - the table docs/hardware-model.md prints."""
        return {f.name: (getattr(self, f.name), f.metadata["source"]) for f in fields(self)}


NPU2 = NPU2Facts()
