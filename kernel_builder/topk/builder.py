"""Top-k of one logits partition, merged with the running candidates: out = best_k(prev ∪ logits[:valid]).

MLIR + external C++ (kernel_builder.topk.external.topk_kernel). A bare `air.herd` of one tile (the stitcher wraps
it): the partition's logits [n] bf16 and the previous candidates [2k] i32 are DMA'd L3 -> L1, one call, the new
candidates stored. Chained over the LM head's partitions (base = the partition's first row), the last result is
the token's k best (greedy: k = 1, the argmax), so the host reads 8·k bytes instead of the logits.
"""
from __future__ import annotations

from kernel_builder.emit import L1, Module, attr_dict, herd, memref
from kernel_builder.topk.external import topk_kernel
from kernel_builder.topk.plan import plan_topk

KIND = "topk"


def build(n: int, k: int, base: int, valid: int) -> str:
    plan_topk(n, k, base, valid)
    ext = topk_kernel(n, k, base, valid)
    x_ty, c_ty = memref([1, n]), memref([1, 2 * k], "i32")
    xl_ty, cl_ty = memref([n], "bf16", L1), memref([2 * k], "i32", L1)
    mod = Module(KIND, [x_ty, c_ty, c_ty])
    mod.declare(ext.symbol, ext.obj, [xl_ty, cl_ty, cl_ty])
    attrs = [attr_dict(KIND, {"n": n, "k": k, "base": base, "valid": valid}), f'link_with = "{ext.obj}"']
    h = herd(mod.body, "topk_herd", (1, 1), [(mod.args[0], x_ty), (mod.args[1], c_ty), (mod.args[2], c_ty)], attrs)
    x, prev, out = h.args
    b = h.body
    xl, pl, ol = b.alloc("x_l1", xl_ty), b.alloc("prev_l1", cl_ty), b.alloc("out_l1", cl_ty)
    b.dma(xl, xl_ty, None, x, x_ty, ([0, 0], [1, n], [n, 1]))
    b.dma(pl, cl_ty, None, prev, c_ty, ([0, 0], [1, 2 * k], [2 * k, 1]))
    b.call(ext.symbol, [(xl, xl_ty), (pl, cl_ty), (ol, cl_ty)])
    b.dma(out, c_ty, ([0, 0], [1, 2 * k], [2 * k, 1]), ol, cl_ty, None)
    for v, t in ((xl, xl_ty), (pl, cl_ty), (ol, cl_ty)):
        b.dealloc(v, t)
    return mod.text()
