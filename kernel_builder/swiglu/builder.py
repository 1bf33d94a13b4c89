"""SwiGLU: y = silu(gate) * up = gate * sigmoid(gate) * up   (f32 math, bf16 RNE out).

MLIR + external C++ (kernel_builder.swiglu.external.swiglu_kernel). launch -> segment -> herd [herd, 1]. The operands
are read as 1-D `rows*dim` elements; tile t owns a contiguous range and moves `chunk` elements per step: gate
and up DMA'd L3 -> L1 (allocated in the loop: ping-ponged), one call into `y_l1` (allocated once: the call
writes it), y stored. Offsets are affine in the tile id and the loop iv (no div/rem); three L3 streams per tile
(at most 8 tiles in the shim budget).
"""
from __future__ import annotations

from kernel_builder.emit import gated_unit_module
from kernel_builder.swiglu.external import swiglu_kernel
from kernel_builder.swiglu.plan import plan_swiglu

KIND = "swiglu"


def build(rows: int, dim: int) -> str:
    plan = plan_swiglu(rows, dim)
    return gated_unit_module(KIND, rows, dim, plan, swiglu_kernel(plan.chunk_elements))
