"""GeGLU: y = gelu_tanh(gate) * up (Gemma; gelu_tanh = PyTorch gelu(approximate="tanh"))   (f32 math, bf16 RNE out).

MLIR + external C++ (kernel_builder.geglu.external.geglu_kernel). launch -> segment -> herd [herd, 1]. The operands
are read as 1-D `rows*dim` elements; tile t owns a contiguous range and moves `chunk` elements per step: gate
and up DMA'd L3 -> L1 (allocated in the loop: ping-ponged), one call into `y_l1` (allocated once: the call
writes it), y stored. Offsets are affine in the tile id and the loop iv (no div/rem); three L3 streams per tile
(at most 8 tiles in the shim budget).
"""
from __future__ import annotations

from kernel_builder.emit import L1, Module, attr_dict, elementwise_body, herd, launch, memref, segment
from kernel_builder.geglu.external import geglu_kernel
from kernel_builder.geglu.plan import plan_geglu

KIND = "geglu"


def build(rows: int, dim: int) -> str:

    plan = plan_geglu(rows, dim)
    n = plan.chunk_elements
    ext = geglu_kernel(n)
    ty = memref([rows, dim])
    l1_ty = memref([n], "bf16", L1)
    mod = Module(KIND, [ty, ty, ty])
    mod.declare(ext.symbol, ext.obj, [l1_ty, l1_ty, l1_ty])
    types = [ty, ty, ty]

    la = launch(mod.body, [1, 1], list(zip(mod.args, types)), [attr_dict(KIND, {"rows": rows, "dim": dim})])
    seg = segment(la.body, "geglu_seg", list(zip(la.args, types)))
    h = herd(seg.body, "geglu_herd", (plan.herd, 1), list(zip(seg.args, types)), [f'link_with = "{ext.obj}"'])
    elementwise_body(h, plan, ext.symbol, l1_ty, ("gate", "up"), ty, ty)
    return mod.text()
