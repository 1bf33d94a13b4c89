"""RMSNorm: y[r, :] = x[r, :] * rsqrt(mean(x[r, :]^2) + eps) * w   (bf16 in/out, f32 math).

MLIR + external C++ (kernel_builder.rmsnorm.external.rmsnorm_kernel, AIE2P vector path). launch -> segment -> herd
[herd, 1]. The data is read as 1-D: `rows*dim/group` groups of `group` consecutive elements (a row, or with
`group` one head of a row), each normalised with the [group] weight. The segment stages the weight once in a
memory-tile buffer; tile t owns a contiguous range of groups and per step DMAs `chunk` groups of x (L3) and the
weight (from L2: the same bytes for every tile, one broadcast; re-sent every step because an L1 buffer loaded
once outside the loop of a multi-tile herd fails mlir-air's air-dma-to-channel, and from L2 because a shim DMA
task repeats at most 256 times), calls the kernel into `y_l1` (allocated once at the top of the herd: the call
writes it) and stores the chunk. Offsets are affine in the tile id and the loop iv (no div/rem); a loop of one
trip is not emitted.
"""
from __future__ import annotations

from kernel_builder.emit import L1, L2, Module, attr_dict, herd, launch, memref, segment
from kernel_builder.rmsnorm.bfp_builder import build_bfp
from kernel_builder.rmsnorm.external import rmsnorm_kernel
from kernel_builder.rmsnorm.plan import plan_rmsnorm

KIND = "rmsnorm"
OUTS = ("bf16", "bfp16")


def build(rows: int, dim: int, eps: float, group: int = 0, offset: int = 0, out: str = "bf16") -> str:
    """`group` (a divisor of dim): normalise every `group` consecutive elements of a row on their own, with a
    [group] weight (per-head q/k norm); 0 = the whole row. `offset` 1: multiply by (1 + w) (Gemma). `out`
    "bfp16": y is i8 [rows/8, 9*dim] in block float (kernel_builder.rmsnorm.bfp_builder; rows a multiple of 8, no
    `group`)."""

    eps = float(eps)
    if not eps > 0.0:
        raise ValueError(f"rmsnorm: eps must be a positive float, got {eps!r}")
    if out not in OUTS:
        raise ValueError(f"rmsnorm: out must be one of {', '.join(OUTS)}, got {out!r}")
    if out == "bfp16":
        if group:
            raise ValueError(f"rmsnorm: out='bfp16' normalises whole rows; group={group} is not supported")
        return build_bfp(rows, dim, eps, offset)
    plan = plan_rmsnorm(rows, dim, group)
    g = plan.group
    n = plan.chunk_elements
    ext = rmsnorm_kernel(g, plan.chunk, offset)
    x_ty, w_ty = memref([rows, dim]), memref([g])
    xl_ty, wl_ty = memref([n], "bf16", L1), memref([g], "bf16", L1)
    mod = Module(KIND, [x_ty, w_ty, x_ty])
    mod.declare(ext.symbol, ext.obj, [xl_ty, wl_ty, xl_ty, "f32"])
    params = {"rows": rows, "dim": dim, "eps": eps}
    if group:
        params["group"] = group
    if offset:
        params["offset"] = offset
    types = [x_ty, w_ty, x_ty]
    w2_ty = memref([g], "bf16", L2)
    la = launch(mod.body, [1, 1], list(zip(mod.args, types)), [attr_dict(KIND, params)])
    seg = segment(la.body, "rmsnorm_seg", list(zip(la.args, types)))
    sb = seg.body
    w2 = sb.alloc("w_l2", w2_ty)
    sb.dma(w2, w2_ty, None, seg.args[1], w_ty, ([0], [g], [1]))
    h = herd(sb, "rmsnorm_herd", (plan.herd, 1), [(seg.args[0], x_ty), (w2, w2_ty), (seg.args[2], x_ty)],
             [f'link_with = "{ext.obj}"'])
    sb.dealloc(w2, w2_ty)
    b = h.body
    x, w, y = h.args
    per_tile = plan.units_per_tile * g

    yl = b.alloc("y_l1", xl_ty)
    if plan.steps > 1:
        b.pin_to_scope(yl, xl_ty)  # written by the call: one copy, outside the ping-ponged loop
    first = b.muli(h.ids[0], per_tile)
    loop, i = b.for_(0, per_tile, n, "e") if plan.steps > 1 else (b, 0)
    off = loop.addi(first, i) if plan.steps > 1 else first
    xl = loop.alloc("x_l1", xl_ty)
    wl = loop.alloc("w_l1", wl_ty)
    loop.dma(wl, wl_ty, None, w, w2_ty, ([0], [g], [1]))
    loop.dma(xl, xl_ty, None, x, x_ty, ([off], [n], [1]))
    loop.call(ext.symbol, [(xl, xl_ty), (wl, wl_ty), (yl, xl_ty), (loop.f32(eps), "f32")])
    loop.dma(y, x_ty, ([off], [n], [1]), yl, xl_ty, None)
    loop.dealloc(xl, xl_ty)
    loop.dealloc(wl, wl_ty)
    b.dealloc(yl, xl_ty)
    return mod.text()
