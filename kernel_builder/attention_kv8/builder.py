"""Decode attention (one query row per head at position pos) over a KV8 cache window of `kv_rows` positions
(kernel_builder/kv_quant/reference.py has the row layout): the bf16 decode's flash-decoding schedule
(kernel_builder/attention/builder.py `_decode`) with int8 items.

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

from kernel_builder.attention.builder import _i32, _receive_position, _send_position
from kernel_builder.attention_kv8 import plan as planner
from kernel_builder.attention_kv8.external import attention_kv8_kernels
from kernel_builder.kv_quant.reference import block_bytes, row_bytes
from kernel_builder.emit import L1, L2, Module, attr_dict, herd, launch, memref, segment

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
    hd, lq, lk, ib = p.head_dim, p.lq, p.lk, p.item_bytes
    X, Y, G = p.herd_x, p.herd_y, p.lq
    qw, rb = p.heads * hd, row_bytes(p.kv_heads, p.head_dim)
    ext = attention_kv8_kernels(hd, lq, lk, X, p.window, scale_dim)
    q_ty, kv_ty, pos_ty = memref([1, qw]), memref([p.kv_rows, rb], "i8"), memref([1], "i32")
    types = [q_ty, kv_ty, pos_ty, q_ty]
    mod = Module(KIND, types)
    params = {"rows": 1, "kv_rows": p.kv_rows, "heads": p.heads, "kv_heads": p.kv_heads, "head_dim": hd,
              **({"window": p.window} if p.window else {}), **({"scale_dim": scale_dim} if scale_dim else {})}
    la = launch(mod.body, list(p.launch_grid), list(zip(mod.args, types)), [attr_dict(KIND, params)])
    seg = segment(la.body, "attention_seg", list(zip(la.args, types)) + [(i, "index") for i in la.ids])
    item_ty, st_ty = memref([ib], "i8", L1), memref([p.state_floats], "f32", L1)
    parts_ty, out_ty = memref([X * p.state_floats], "f32", L1), memref([lq, hd], "bf16", L1)
    mod.declare(ext.init.symbol, ext.obj, [st_ty])
    mod.declare(ext.update.symbol, ext.obj, [item_ty, st_ty, "i32", "i32"])
    mod.declare(ext.out.symbol, ext.obj, [parts_ty, out_ty])
    ch_pos = mod.channel("attn_pos", [1, 1], [X, Y])
    ch_in = mod.channel("attn_in", [X, Y])
    ch_part = mod.channel("attn_part", [X, Y])
    ch_merge = mod.channel("attn_merge", [1, Y])

    s = seg.body
    q, kv, pos, o, gi = seg.args
    _send_position(s, ch_pos, pos)
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
            tl.channel_put(ch_in, [x, y], it2, it2_ty, ([y * ib], [ib], [1]))
        tl.dealloc(it2, it2_ty)

    # ---- herd: each core's share of its kv head's window into an online-softmax partial
    h = herd(s, "attention_herd", (X, Y), [], [f'link_with = "{ext.obj}"'])
    hb = h.body
    tx, ty = h.ids
    pos_i32 = _receive_position(hb, ch_pos, tx, ty, p)
    st = hb.alloc("state_l1", st_ty)
    hb.call(ext.init.symbol, [(st, st_ty)])
    share0 = hb.muli(tx, p.share)
    il, it = hb.for_(0, p.kv_tiles, 1, "t")
    item = il.alloc("item_l1", item_ty)
    il.channel_get(ch_in, [tx, ty], item, item_ty, None)
    k_pos0 = _i32(il, il.addi(share0, il.muli(it, lk)))
    il.call(ext.update.symbol, [(item, item_ty), (st, st_ty), (pos_i32, "i32"), (k_pos0, "i32")])
    il.dealloc(item, item_ty)
    hb.channel_put(ch_part, [tx, ty], st, st_ty, None)
    hb.dealloc(st, st_ty)

    # ---- segment: per kv head y, its herd_x partials L1 -> L2 -> merge core y (the bf16 decode's merge)
    p2_ty = memref([X * p.state_floats], "f32", L2)
    for y in range(Y):
        p2 = s.alloc("parts_l2", p2_ty)
        for x in range(X):
            s.channel_get(ch_part, [x, y], p2, p2_ty, ([x * p.state_floats], [p.state_floats], [1]))
        s.channel_put(ch_merge, [0, y], p2, p2_ty, None)
        s.dealloc(p2, p2_ty)
    mh = herd(s, "attention_merge", (1, Y), [(o, q_ty), (g0, "index")], [f'link_with = "{ext.obj}"'])
    mb = mh.body
    mx, my = mh.ids
    o_l3, mg0 = mh.args
    parts, out = mb.alloc("parts_l1", parts_ty), mb.alloc("out_l1", out_ty)
    mb.channel_get(ch_merge, [mx, my], parts, parts_ty, None)
    mb.call(ext.out.symbol, [(parts, parts_ty), (out, out_ty)])
    col = mb.muli(mb.addi(mg0, my), G * hd)
    mb.dma(o_l3, q_ty, ([0, col], [1, G * hd], [qw, 1]), out, out_ty, None)
    mb.dealloc(parts, parts_ty)
    mb.dealloc(out, out_ty)
    return mod.text()
