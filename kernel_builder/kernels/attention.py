"""Causal GQA attention of `rows` query rows at positions pos..pos+rows-1 over a KV window of `kv_rows` positions
(kernel_builder.reference.attention): prefill chunks (rows > 1, at position 0 or over a KV prefix) and decode
(rows == 1, flash-decoding). Query head h uses kv head h // (heads // kv_heads); `pos` is a per-call i32
(memref<1xi32>) that every core reads from L1.

Arguments (SIGNATURES["attention"]): q [rows, heads*hd], k/v [kv_rows, kv_heads*hd] (position-major: row p =
every kv head's vector of position p), pos [1] i32, o [rows, heads*hd]. Plans: kernel_builder.attention_plan.plan_attention.

Every core has two inbound streams (the position, once; its item stream) and one outbound stream, and all
DMAs are static: the K/V window is streamed whole; the cores skip the compute of tiles past the causal
bound using pos (the tile primitives, external_kernels/attention.cc, leave fully masked rows unchanged).

Prefill: a herd of herd_x groups x herd_y cores; the cores of group x run herd_y query heads of the kv head
on query block round*herd_x + x. Launch grid [kv heads, head passes, rounds]; per launch iteration
  - launch level: per group, two feed channels (@attn_fk, @attn_fv: one shim stream each) get one put of the
    group's Q tile halves (and the pad half when the item count would be odd) and one put of the whole K (V)
    window of the kv head, straight from L3;
  - segment: pos L3 -> L2 -> @attn_pos (broadcast); one uniform loop of q_items + kv_tiles items per group:
    two gets (K rows / V rows, or the Q halves) into an L2 item, one put on @attn_in[x, 0] (broadcast to the
    group's cores);
  - herd: init; per item: the Q tile kept by core `slot` (t < n_q), else an online-softmax update; finish; the
    output tile DMA'd straight to o.
Decode: herd_x splits of the window (herd_y = 1) and a one-core merge herd; launch grid [kv heads]. Per K/V
tile step the segment DMAs, per split x, the K and V tiles and the group's query rows into one L2 item and
puts it on @attn_in[x, 0]; each core folds its share into an online-softmax partial and sends it to L2
(@attn_part); the merge core receives the herd_x partials (@attn_merge), combines them and writes the group's
output rows. docs/kernels.md "attention" has the budgets and the reasons.
"""
from __future__ import annotations

from .. import attention_plan as planner
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
    grid = [p.launch] if p.decode else [p.launch, p.head_passes, p.rounds]
    la = launch(mod.body, grid, list(zip(mod.args, types)), [attr_dict(KIND, params)])
    return mod, types, la


def _segment(la, types):
    """The segment (after any launch-level ops already emitted into the launch body); its trailing operands
    are the launch ids."""
    return segment(la.body, "attention_seg", list(zip(la.args, types)) + [(i, "index") for i in la.ids])


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
    mod, types, la = _module(p)
    q_ty, kv_ty = types[0], types[1]
    item_ty, qt_ty = memref([ir, hd], "bf16", L1), memref([lq, hd], "bf16", L1)
    st_ty = memref([p.state_floats], "f32", L1)
    mod.declare(ext.init.symbol, ext.obj, [st_ty, qt_ty])
    mod.declare(ext.update.symbol, ext.obj, [item_ty, qt_ty, st_ty, "i32", "i32", "i32", "i32"])
    mod.declare(ext.out.symbol, ext.obj, [st_ty, qt_ty])
    ch_fk = mod.channel("attn_fk", [X, 1])             # group x's feed of item rows [0, lk): Q heads, then K
    ch_fv = mod.channel("attn_fv", [X, 1])             # ... of item rows [lk, 2lk): Q heads, then V
    ch_pos = mod.channel("attn_pos", [1, 1], [X, Y])
    ch_in = mod.channel("attn_in", [X, 1], [X, Y])     # a group's item stream reaches its herd_y cores

    # ---- launch (iteration = kv head g, head pass hs, round rd): per group, on each of its two feed channels
    # (one shim stream each), one put of the group's Q tile halves (herd_y heads) and one put of the whole
    # K (V) window; the segment's gets take them an item half at a time. No loops here: each put is one shim BD
    # (air-opt-shim-dma-bds folds a loop into a BD only when the loop variable is an offset by itself).
    rl = la.body
    q, k, v, pos, o = la.args
    g, hs, rd = la.ids
    head0 = rl.addi(rl.muli(g, G), rl.muli(hs, Y))       # the query head of core y = 0
    for x in range(X):
        row0 = rl.muli(rl.addi(rl.muli(rd, X), x), lq)   # the group's query block: rd*X + x
        row1 = rl.addi(row0, lq - lk)                    # the second half's first row
        for ch, row, src in ((ch_fk, row0, k), (ch_fv, row1, v)):
            rl.channel_put(ch, [x, 0], q, q_ty, ([head0, row, 0], [Y, lk, hd], [hd, qw, 1]))
            if p.q_items > Y:   # the pad item (no core keeps it): the item loops get an even trip count
                rl.channel_put(ch, [x, 0], q, q_ty, ([head0, row, 0], [1, lk, hd], [hd, qw, 1]))
            rl.channel_put(ch, [x, 0], src, kv_ty, ([0, g, 0], [p.kv_rows, 1, hd], [kw, hd, 1]))

    # ---- segment: one uniform item loop per group: both halves from the feeds into one L2 item, one put
    seg = _segment(la, types)
    s = seg.body
    sq, sk, sv, spos, so, sg, shs, srd = seg.args
    _send_position(s, ch_pos, spos)
    item2_ty = memref([ir, hd], "bf16", L2)
    sl, _ = s.for_(0, p.steps, 1, "t")
    for x in range(X):
        it2 = sl.alloc("item_l2", item2_ty)
        sl.channel_get(ch_fk, [x, 0], it2, item2_ty, ([0, 0], [lk, hd], [hd, 1]))
        sl.channel_get(ch_fv, [x, 0], it2, item2_ty, ([lk, 0], [lk, hd], [hd, 1]))
        sl.channel_put(ch_in, [x, 0], it2, item2_ty, None)
        sl.dealloc(it2, item2_ty)

    # ---- herd: per head pass and round, Q capture, the window's tiles, finish, the output tile to L3
    h = herd(s, "attention_herd", (X, Y), [(so, q_ty), (sg, "index"), (shs, "index"), (srd, "index")],
             [f'link_with = "{ext.obj}"'])
    hb = h.body
    tx, ty = h.ids
    o_l3, hg, hhs, hrd = h.args
    pos_i32 = _receive_position(hb, ch_pos, tx, ty)
    slot = _i32(hb, ty)
    n_q = hb.i32(p.q_items)
    # the Q/output tile and the state live outside the item loop (the only loop aircc should ping-pong)
    hrl = hb
    qt, st = hrl.alloc("q_l1", qt_ty), hrl.alloc("state_l1", st_ty)
    hrl.call(ext.init.symbol, [(st, st_ty), (qt, qt_ty)])
    qb = hrl.addi(hrl.muli(hrd, X), tx)                  # this group's query block
    q_pos0 = hrl.value("i", f"arith.addi {pos_i32}, {_i32(hrl, hrl.muli(qb, lq))} : i32")
    il, it = hrl.for_(0, p.steps, 1, "t")
    item = il.alloc("item_l1", item_ty)
    il.channel_get(ch_in, [tx, ty], item, item_ty, None)
    il.call(ext.update.symbol, [(item, item_ty), (qt, qt_ty), (st, st_ty), (_i32(il, it), "i32"), (n_q, "i32"),
                                (slot, "i32"), (q_pos0, "i32")])
    il.dealloc(item, item_ty)
    hrl.call(ext.out.symbol, [(st, st_ty), (qt, qt_ty)])  # the output tile replaces the Q tile
    head = hrl.addi(hrl.addi(hrl.muli(hg, G), hrl.muli(hhs, Y)), ty)
    hrl.dma(o_l3, q_ty, ([hrl.muli(qb, lq), head, 0], [lq, 1, hd], [qw, hd, 1]), qt, qt_ty, None)
    hrl.dealloc(qt, qt_ty)
    hrl.dealloc(st, st_ty)
    return mod.text()


def _decode(p: planner.AttentionPlan) -> str:
    from .. import externals

    hd, lq, lk, ir = p.head_dim, p.lq, p.lk, p.item_rows
    X, G = p.herd_x, p.group
    qw, kw = p.heads * hd, p.kv_heads * hd
    ext = externals.attention_decode_kernels(hd, lq, lk, X)
    mod, types, la = _module(p)
    seg = _segment(la, types)
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
    # the loop variable is the first key of the tile within a split; the split is its own dimension (see
    # _prefill: loop variables appear as offsets of their own dimension for the shim BD folding)
    tl, key = s.for_(0, p.share, lk, "key")
    kv2_ty = memref([ir, hd], "bf16", L2)
    for x in range(X):
        kv2 = tl.alloc("kv_l2", kv2_ty)
        for half, src in ((0, k), (lk, v)):
            tl.dma(kv2, kv2_ty, ([half, 0], [lk, hd], [hd, 1]), src, kv_ty,
                   ([x, key, g, 0], [1, lk, 1, hd], [p.share * kw, kw, hd, 1]))
        tl.dma(kv2, kv2_ty, ([2 * lk, 0], [lq, hd], [hd, 1]), q, q_ty, ([0, g, 0], [1, 1, G * hd], [qw, G * hd, 1]))
        tl.channel_put(ch_in, [x, 0], kv2, kv2_ty, ([0, 0], [ir, hd], [hd, 1]))
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
