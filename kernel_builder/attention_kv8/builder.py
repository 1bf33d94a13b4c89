"""Decode attention (one query row per head at position pos) over a KV8 cache window of `kv_rows` positions
(kernel_builder/kv_quant/reference.py has the row layout): the bf16 decode's flash-decoding schedule
(kernel_builder/attention/builder.py `_decode`) with int8 items: the item stream is this file's, the split herd,
the partials' way through L2 and the merge herd are kernel_builder/attention/schedule.py's `decode_cores`.

Arguments (SIGNATURES["attention_kv8"]): q bf16 [1, heads*hd], kv int8 [kv_rows, row_bytes] (position-major KV8
rows: per kv head a block of K codes, V codes, K scale, V scale), pos [1] i32, o bf16 [1, heads*hd]. Plan:
plan.plan_attention_kv8.

herd_x splits of the window x herd_y kv heads, a merge herd [1, herd_y]; launch grid [kv_heads / herd_y]. Every
core receives the position (one broadcast from the shim) and its item stream. Per K/V tile step, per split x,
three DMAs fill one int8 L2 buffer laid out per kv head ([herd_y][item]: the tile's key blocks [lk][block], the
group's query rows as bf16 bytes): the blocks of the herd_y heads are one contiguous run per position, so the
tile's first and second half of keys are one DMA each (two shim streams of codes and scales), and the query rows
a third (a bf16 L3 source: the DMA moves bytes); core (x, y) gets item y with one contiguous put. Each core folds its share into an online-softmax partial (dequantizing the
visible rows to bf16 in L1, external_kernels/attention_kv8.h); merge core y combines its head's herd_x partials
into the group's output rows. Per position and kv head the window moves 2 * hd + 8 bytes, 53% of the bf16 cache's
4 * hd at hd = 64, on twice the bf16 decode's streams per split.
"""
from __future__ import annotations

from kernel_builder.attention.schedule import decode_channels, decode_cores, frame, segment_of, send_position
from kernel_builder.attention_kv8 import plan as planner
from kernel_builder.attention_kv8.external import attention_kv8_kernels
from kernel_builder.kv_quant.reference import block_bytes, row_bytes
from kernel_builder.emit import L1, L2, memref

KIND = "attention_kv8"


def build(rows: int, kv_rows: int, heads: int, kv_heads: int, head_dim: int, window: int | None = None,
          scale_dim: int | None = None) -> str:
    if rows != 1:
        raise ValueError(f"attention_kv8: decode only (rows=1), got rows={rows}; a prefill chunk reads the KV8 "
                         f"cache dequantized (docs/quantization.md)")
    p = planner.plan_attention_kv8(kv_rows, heads, kv_heads, head_dim, window)
    scale_dim = None if scale_dim in (None, head_dim) else scale_dim
    return _decode(p, scale_dim)


def _decode(p: planner.AttentionKv8Plan, scale_dim: int | None) -> str:
    hd, lk, ib = p.head_dim, p.lk, p.item_bytes
    X, Y, G = p.herd_x, p.herd_y, p.group
    qw, rb = p.heads * hd, row_bytes(p.kv_heads, p.head_dim)
    ext = attention_kv8_kernels(hd, p.lq, lk, X, p.window, scale_dim)
    q_ty, kv_ty, pos_ty = memref([1, qw]), memref([p.kv_rows, rb], "i8"), memref([1], "i32")
    types = [q_ty, kv_ty, pos_ty, q_ty]
    mod, la = frame(KIND, p, types, scale_dim)
    seg = segment_of(la, types)
    c = decode_channels(mod, ext, p, memref([ib], "i8", L1))

    s = seg.body
    q, kv, pos, o, gi = seg.args
    send_position(s, c.ch_pos, pos)
    g0 = s.muli(gi, Y)

    # ---- per K/V tile step, per split x: the key blocks (two halves of the tile) and query rows of the herd_y heads
    # -> one L2 buffer [herd_y][item]; core (x, y) gets item y. The key loop variable is an offset of its own
    # dimension.
    tl, key = s.for_(0, p.share, lk, "key")
    it2_ty = memref([Y * ib], "i8", L2)
    bb, half = block_bytes(hd), lk // 2
    q0 = lk * bb
    for x in range(X):
        it2 = tl.alloc("kv_l2", it2_ty)
        # block byte b of head g0 + y, key a*half + r -> item y byte (a*half + r)*block + b
        for a in range(2):
            tl.dma(it2, it2_ty, ([0, 0, a * half * bb], [half, Y, bb], [bb, ib, 1]), kv, kv_ty,
                   ([x, key, a, tl.muli(g0, bb)], [1, half, 1, Y * bb], [p.share * rb, rb, half * rb, 1]))
        # query rows of kv head g0 + y (heads (g0 + y)*G .. +G: G*hd contiguous bf16) -> item y bytes q0 ..; in runs
        # of hd bytes (hd/2 bf16), y inside: no contiguous run longer than a BD dimension allows (a group's 2*G*hd
        # bytes are 1 KiB at head_dim 128, group 4)
        tl.dma(it2, it2_ty, ([0, 0, q0], [2 * G, Y, hd], [hd, ib, 1]), q, q_ty,
               ([0, 0, tl.muli(g0, G * hd)], [2 * G, Y, hd // 2], [hd // 2, G * hd, 1]))
        for y in range(Y):
            tl.channel_put(c.ch_in, [x, y], it2, it2_ty, ([y * ib], [ib], [1]))
        tl.dealloc(it2, it2_ty)

    decode_cores(s, c, p, o, q_ty, g0)   # the bf16 decode's split herd, partials through L2 and merge herd
    return mod.text()
