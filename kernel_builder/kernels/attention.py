"""Causal GQA attention of `rows` query rows at positions pos..pos+rows-1 over a KV window of `kv_rows` positions
(kernel_builder.reference.attention): prefill chunks (rows > 1, at position 0 or over a KV prefix) and decode
(rows == 1, flash-decoding). Query head h uses kv head h // (heads // kv_heads); `pos` is a per-call i32
(memref<1xi32>) that every core reads from L1.

Arguments (SIGNATURES["attention"]): q [rows, heads*hd], k/v [kv_rows, kv_heads*hd] (position-major: row p =
every kv head's vector of position p), pos [1] i32, o [rows, heads*hd]. Plans: planner.plan_attention.

Every core has two inbound streams (the position, once; its item stream) and one outbound stream, and all
DMAs are static: the K/V window is streamed whole; the cores skip the compute of tiles past the causal
bound using pos (the tile primitives, external_kernels/attention.cc, leave fully masked rows unchanged).

Prefill: a herd of herd_x groups x herd_y cores; the cores of group x work on the same query block and kv
head (herd_y query heads of its GQA group). Per launch iteration (a block of xh kv heads), per head pass and
round, the segment
  - DMAs the Q tiles of every core L3 -> L2 (one DMA) and puts each group's stacked Q tiles on its item
    channel @attn_in[x, 0], broadcast to the group's herd_y cores (each keeps its own rows: q_row0);
  - streams the window: per K/V tile, K and V of the xh kv heads L3 -> one L2 buffer (two DMAs) and one put
    per group of its kv head's [K; V] rows on @attn_in[x, 0];
  - gathers the output tiles (@attn_out[x, y], L1 -> L2) and writes each group's block to L3 (one DMA).
Decode: herd_x splits of the window x herd_y kv heads. Per K/V tile step the segment DMAs, per split x, the
K and V tiles and the query rows of the herd_y kv heads into one L2 buffer and puts each core's
[K; V; q] item on @attn_in[x, y]; each core folds its share into an online-softmax partial and sends it to L2
(@attn_part); a merge herd (herd_y cores) receives a kv head's herd_x partials (@attn_merge), combines them
and writes the group's output rows.
"""
from __future__ import annotations

from .. import planner
from ._emit import L1, L2, Module, attr_dict, herd, launch, memref, segment

KIND = "attention"


def build(rows: int, kv_rows: int, heads: int, kv_heads: int, head_dim: int) -> str:
    p = planner.plan_attention(rows, kv_rows, heads, kv_heads, head_dim)
    return (_decode if p.decode else _prefill)(p)


def _module(p: planner.AttentionPlan):
    hd = p.head_dim
    q_ty, kv_ty = memref([p.rows, p.heads * hd]), memref([p.kv_rows, p.kv_heads * hd])
    types = [q_ty, kv_ty, kv_ty, memref([1], "i32"), q_ty]
    mod = Module(KIND, types)
    params = {"rows": p.rows, "kv_rows": p.kv_rows, "heads": p.heads, "kv_heads": p.kv_heads, "head_dim": hd}
    la = launch(mod.body, [p.launch], list(zip(mod.args, types)), [attr_dict(KIND, params)])
    seg = segment(la.body, "attention_seg", list(zip(la.args, types)) + [(la.ids[0], "index")])
    return mod, types, seg


def _send_position(s, ch_pos: str, pos_l3: str) -> None:
    """The segment DMAs pos L3 -> L2 and broadcasts it to every core of the herd."""
    pos2_ty = memref([1], "i32", L2)
    pos2 = s.alloc("pos_l2", pos2_ty)
    s.dma(pos2, pos2_ty, None, pos_l3, memref([1], "i32"), None)
    s.channel_put(ch_pos, [0, 0], pos2, pos2_ty, None)


def _receive_position(hb, ch_pos: str, tx: str, ty: str) -> str:
    """A core receives the position into L1 (4 bytes) and loads it: the i32 SSA value."""
    pos1_ty = memref([1], "i32", L1)
    pos1 = hb.alloc("pos_l1", pos1_ty)
    hb.channel_get(ch_pos, [tx, ty], pos1, pos1_ty, None)
    return hb.value("pos", f"memref.load {pos1}[{hb.idx(0)}] : {pos1_ty}")


def _i32(b, v: str) -> str:
    return b.value("i", f"arith.index_cast {v} : index to i32")


def _prefill(p: planner.AttentionPlan) -> str:
    from .. import externals

    hd, lq, lk, ir = p.head_dim, p.lq, p.lk, p.item_rows
    X, Y, G = p.herd_x, p.herd_y, p.group
    qw, kw = p.heads * hd, p.kv_heads * hd
    ext = externals.attention_prefill_kernels(hd, lq, lk)
    mod, types, seg = _module(p)
    q_ty, kv_ty = types[0], types[1]
    item_ty, qt_ty = memref([ir, hd], "bf16", L1), memref([lq, hd], "bf16", L1)
    st_ty = memref([p.state_floats], "f32", L1)
    mod.declare(ext.init.symbol, ext.obj, [st_ty])
    mod.declare(ext.update.symbol, ext.obj, [item_ty, qt_ty, st_ty, "i32", "i32", "i32", "i32"])
    mod.declare(ext.out.symbol, ext.obj, [st_ty, qt_ty])
    ch_pos = mod.channel("attn_pos", [1, 1], [X, Y])
    ch_in = mod.channel("attn_in", [X, 1], [X, Y])     # a group's item stream reaches its herd_y cores
    ch_out = mod.channel("attn_out", [X, Y])

    s = seg.body
    q, k, v, pos, o, g = seg.args                        # g: the kv head of this launch iteration
    _send_position(s, ch_pos, pos)

    # ---- segment, producer side: per head pass and round, the Q tiles, then the whole K/V window
    hl, hs = s.for_(0, p.head_passes, 1, "hs")
    rl, rd = hl.for_(0, p.rounds, 1, "rd")
    q2_ty = memref([p.q_stack_rows, hd], "bf16", L2)
    q2 = rl.alloc("q_l2", q2_ty)
    head0 = rl.addi(rl.muli(g, G), rl.muli(hs, Y))       # query head of the groups' core y = 0
    if X > 1:   # dims: query-block slot, head y, row, column (the stack of group x at row x*Y*lq)
        l3 = ([rl.muli(rd, X), head0, 0, 0], [X, Y, lq, hd], [lq * qw, hd, qw, 1])
    else:
        l3 = ([head0, rl.muli(rd, lq), 0], [Y, lq, hd], [hd, qw, 1])
    rl.dma(q2, q2_ty, ([0], [X * Y * lq * hd], [1]), q, q_ty, l3)
    for x in range(X):
        jl, j = rl.for_(0, p.q_items, 1, "j")
        row = jl.addi(jl.muli(j, ir), x * Y * lq)
        jl.channel_put(ch_in, [x, 0], q2, q2_ty, ([row, 0], [ir, hd], [hd, 1]))
    rl.dealloc(q2, q2_ty)
    tl, t = rl.for_(0, p.kv_tiles, 1, "t")
    kv2_ty = memref([ir, hd], "bf16", L2)
    kv2 = tl.alloc("kv_l2", kv2_ty)
    key0 = tl.muli(t, lk)
    for half, src in ((0, k), (lk, v)):                  # K rows, then V rows
        tl.dma(kv2, kv2_ty, ([half, 0], [lk, hd], [hd, 1]), src, kv_ty, ([key0, tl.muli(g, hd)], [lk, hd], [kw, 1]))
    for x in range(X):
        tl.channel_put(ch_in, [x, 0], kv2, kv2_ty, None)
    tl.dealloc(kv2, kv2_ty)

    # ---- herd: per head pass and round, Q capture, the window's tiles, finish, output tile to L2
    h = herd(s, "attention_herd", (X, Y), [], [f'link_with = "{ext.obj}"'])
    hb = h.body
    tx, ty = h.ids
    pos_i32 = _receive_position(hb, ch_pos, tx, ty)
    q_row0 = _i32(hb, hb.muli(ty, lq))
    n_q = hb.i32(p.q_items)
    hhl, _ = hb.for_(0, p.head_passes, 1, "hs")
    hrl, hrd = hhl.for_(0, p.rounds, 1, "rd")
    qt, st = hrl.alloc("q_l1", qt_ty), hrl.alloc("state_l1", st_ty)
    hrl.call(ext.init.symbol, [(st, st_ty)])
    qb = hrl.addi(hrl.muli(hrd, X), tx)                  # this group's query block
    q_pos0 = hrl.value("i", f"arith.addi {pos_i32}, {_i32(hrl, hrl.muli(qb, lq))} : i32")
    il, it = hrl.for_(0, p.q_items + p.kv_tiles, 1, "t")
    item = il.alloc("item_l1", item_ty)
    il.channel_get(ch_in, [tx, ty], item, item_ty, None)
    il.call(ext.update.symbol, [(item, item_ty), (qt, qt_ty), (st, st_ty), (_i32(il, it), "i32"), (n_q, "i32"),
                                (q_row0, "i32"), (q_pos0, "i32")])
    il.dealloc(item, item_ty)
    hrl.call(ext.out.symbol, [(st, st_ty), (qt, qt_ty)])  # the output tile replaces the Q tile
    hrl.channel_put(ch_out, [tx, ty], qt, qt_ty, None)
    hrl.dealloc(qt, qt_ty)
    hrl.dealloc(st, st_ty)

    # ---- segment, consumer side: each group's output block L1 -> L2 -> L3
    ol, ohs = s.for_(0, p.head_passes, 1, "hs")
    orl, ord_ = ol.for_(0, p.rounds, 1, "rd")
    o2_ty = memref([Y * lq, hd], "bf16", L2)
    ohead0 = orl.addi(orl.muli(g, G), orl.muli(ohs, Y))
    for x in range(X):
        o2 = orl.alloc("o_l2", o2_ty)
        for y in range(Y):
            orl.channel_get(ch_out, [x, y], o2, o2_ty, ([y * lq, 0], [lq, hd], [hd, 1]))
        row0 = orl.muli(orl.addi(orl.muli(ord_, X), x), lq)
        orl.dma(o, q_ty, ([ohead0, row0, 0], [Y, lq, hd], [hd, qw, 1]), o2, o2_ty, None)
        orl.dealloc(o2, o2_ty)
    return mod.text()


def _decode(p: planner.AttentionPlan) -> str:
    from .. import externals

    hd, lq, lk, ir = p.head_dim, p.lq, p.lk, p.item_rows
    X, G = p.herd_x, p.group
    qw, kw = p.heads * hd, p.kv_heads * hd
    ext = externals.attention_decode_kernels(hd, lq, lk, X)
    mod, types, seg = _module(p)
    q_ty, kv_ty = types[0], types[1]
    item_ty, st_ty = memref([ir, hd], "bf16", L1), memref([p.state_floats], "f32", L1)
    parts_ty, out_ty = memref([X * p.state_floats], "f32", L1), memref([lq, hd], "bf16", L1)
    mod.declare(ext.init.symbol, ext.obj, [st_ty])
    mod.declare(ext.update.symbol, ext.obj, [item_ty, st_ty, "i32", "i32"])
    mod.declare(ext.out.symbol, ext.obj, [parts_ty, out_ty])
    ch_pos = mod.channel("attn_pos", [1, 1], [X, 1])
    ch_in = mod.channel("attn_in", [X, 1])
    ch_part = mod.channel("attn_part", [X, 1])
    ch_merge = mod.channel("attn_merge", [1, 1])

    s = seg.body
    q, k, v, pos, o, g = seg.args                        # g: the kv head of this launch iteration
    _send_position(s, ch_pos, pos)

    # ---- segment: per K/V tile step, per split x: its K and V tiles and the group's query rows -> L2 -> core x
    tl, t = s.for_(0, p.kv_tiles, 1, "t")
    kv2_ty = memref([ir, hd], "bf16", L2)
    col = tl.muli(g, hd)
    for x in range(X):
        kv2 = tl.alloc("kv_l2", kv2_ty)
        key0 = tl.addi(tl.muli(t, lk), x * p.share)
        for half, src in ((0, k), (lk, v)):
            tl.dma(kv2, kv2_ty, ([half, 0], [lk, hd], [hd, 1]), src, kv_ty, ([key0, col], [lk, hd], [kw, 1]))
        tl.dma(kv2, kv2_ty, ([2 * lk, 0], [lq, hd], [hd, 1]), q, q_ty, ([0, tl.muli(g, G * hd)], [1, G * hd], [qw, 1]))
        tl.channel_put(ch_in, [x, 0], kv2, kv2_ty, None)
        tl.dealloc(kv2, kv2_ty)

    # ---- herd: each core's share of the window into an online-softmax partial
    h = herd(s, "attention_herd", (X, 1), [], [f'link_with = "{ext.obj}"'])
    hb = h.body
    tx, ty = h.ids
    pos_i32 = _receive_position(hb, ch_pos, tx, ty)
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

    # ---- segment: the partials L1 -> L2 -> the merge core
    p2_ty = memref([X * p.state_floats], "f32", L2)
    p2 = s.alloc("parts_l2", p2_ty)
    for x in range(X):
        s.channel_get(ch_part, [x, 0], p2, p2_ty, ([x * p.state_floats], [p.state_floats], [1]))
    s.channel_put(ch_merge, [0, 0], p2, p2_ty, None)
    s.dealloc(p2, p2_ty)

    # ---- merge herd: combine the partials, write the group's output rows
    mh = herd(s, "attention_merge", (1, 1), [(o, q_ty), (g, "index")], [f'link_with = "{ext.obj}"'])
    mb = mh.body
    mx, my = mh.ids
    o_l3, mg = mh.args
    parts, out = mb.alloc("parts_l1", parts_ty), mb.alloc("out_l1", out_ty)
    mb.channel_get(ch_merge, [mx, my], parts, parts_ty, None)
    mb.call(ext.out.symbol, [(parts, parts_ty), (out, out_ty)])
    mb.dma(o_l3, q_ty, ([0, mb.muli(mg, G * hd)], [1, G * hd], [qw, 1]), out, out_ty, None)
    mb.dealloc(parts, parts_ty)
    mb.dealloc(out, out_ty)
    return mod.text()
