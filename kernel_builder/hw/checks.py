"""The per-transfer DMA limit checks of the resource analyzer (kernel_builder.hw.analyze): transfer sizes,
alignment, inner strides and BD dimensions/wraps on core and memory tiles, and the shim BD's stride and
dimension limits after loop folding."""
from __future__ import annotations

from kernel_builder.hw.dma import canonical_dims, is_contiguous, iteration_space, linear_offset
from kernel_builder.hw.ir import Access, Loop, Transfer
from kernel_builder.hw.results import AIECC, AIR_TO_AIE, AIRRT_TO_NPU


class TransferChecks:
    """Checks of one side of a transfer, mixed into analyze._LaunchAnalyzer (uses `self.facts` and
    `self.violate`)."""

    def _check_shim_access(self, t: Transfer, acc: Access, stride: int, ndims: int, runs: int = 1) -> None:
        if runs - 1 > self.facts.bd_max_repeat_count:
            self.violate("shim", "DMA task repeat count", runs - 1, self.facts.bd_max_repeat_count, AIECC,
                         f"{acc.buffer.name}: one shim DMA task runs {runs} times (a folded loop that reads the "
                         f"same rows again, or the highest BD dim, is the task's repeat count): aie-dma-tasks-to-npu "
                         f"refuses 'Repeat count exceeds the [0:255] range'", t.line)
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
                                 AIR_TO_AIE, f"{acc.buffer.name}: access pattern {dims} in {acc.buffer.type.dtype} "
                                 f"elements, contiguous dims merged as the tools merge them: a dim over "
                                 f"NPU2.bd_max_size = {f.bd_max_size} elements of any width ('Size may not exceed "
                                 f"1023') or a stride over {f.bd_max_stride}", t.line)
                    break
