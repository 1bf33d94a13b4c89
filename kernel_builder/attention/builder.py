"""Causal GQA attention of `rows` query rows at positions pos..pos+rows-1 over a KV window of `kv_rows` positions
(kernel_builder.reference.attention): prefill chunks (rows > 1, at position 0 or over a KV prefix) and decode
(rows == 1, flash-decoding). Query head h uses kv head h // (heads // kv_heads); `pos` is a per-call i32
(memref<1xi32>) that every core reads from L1.

Arguments (SIGNATURES["attention"]): q [rows, heads*hd], k/v [kv_rows, kv_heads*hd] (position-major: row p =
every kv head's vector of position p), pos [1] i32, o [rows, heads*hd]. Plans: plan.plan_attention.

Every core has two inbound streams (the position, once; its item stream) and one outbound stream, and all
DMAs are static: the K/V window is streamed whole; the cores skip the compute of tiles past the causal
bound using pos (the tile primitives, external_kernels/attention.cc, leave fully masked rows unchanged). The
position's load carries `llama_npu.range = [lo, hi]`, the positions the shape admits, which the hardware model
reads to count the tiles the cores compute (docs/hardware-model.md).

Prefill: a herd of herd_x query blocks x herd_y query heads of the kv head's group, up to all 32 cores. Launch
grid [kv heads, rounds, head passes]; per launch iteration
  - launch level: two feed channels (@attn_fk, @attn_fv: one shim stream each) get one put of the round's Q
    stream (its herd_x * lq rows of each of the herd_y heads, head-major; the pad item when the item count
    would be odd) and one put of the whole K (V) window of the kv head, straight from L3;
  - segment: pos L3 -> @attn_pos (broadcast from the shim); one uniform loop of q_items + kv_tiles items: two gets
    (K rows / V rows, or Q rows) that write them 8x8-blocked (for the block-float kernel) into an L2 item, one put
    on @attn_in (broadcast to every core); then per query block x, the herd_y output tiles from @attn_o[x, y] side
    by side into one L2 buffer, written to o with ONE DMA (the memory-tile drain of mlir-air's GEMM and flash
    attention);
  - herd: init; per item: core (x, y) keeps its head's 8-row Q blocks x, x + herd_x, ... (interleaved: the causal
    work is balanced among the cores), else an online-softmax update; finish; the output tile put on @attn_o.
Decode: herd_x splits of the window x herd_y kv heads, and a merge herd [1, herd_y]; launch grid
[kv heads / herd_y]. Per K/V tile step the segment DMAs, per split x, the K and V rows of the herd_y kv heads
and their groups' query rows into one L2 item and puts each core (x, y) its kv head's columns on
@attn_in[x, y]; each core folds its share into an online-softmax partial and sends it to L2 (@attn_part);
merge core y receives its kv head's herd_x partials (@attn_merge), combines them and writes the group's
output rows. docs/kernels.md "attention" has the budgets and the reasons.
"""
from __future__ import annotations

from kernel_builder.attention import plan as planner
from kernel_builder.attention.external import attention_decode_kernels, attention_prefill_kernels
from kernel_builder.attention.schedule import (decode_channels, decode_cores, frame, i32, receive_position,
                                               segment_of, send_position)
from kernel_builder.emit import L1, L2, herd, memref

KIND = "attention"


def build(rows: int, kv_rows: int, heads: int, kv_heads: int, head_dim: int, window: int | None = None,
          scale_dim: int | None = None) -> str:
    """`window` (None: full causal): a sliding window of keys per query; `scale_dim` (None: head_dim): the
    softmax scale 1/sqrt(scale_dim). Both are compile-time constants of the external kernel."""
    p = planner.plan_attention(rows, kv_rows, heads, kv_heads, head_dim, window)
    scale_dim = None if scale_dim in (None, head_dim) else scale_dim
    return (_decode if p.decode else _prefill)(p, scale_dim)


def _module(p: planner.AttentionPlan, scale_dim: int | None):
    q_ty, kv_ty = memref([p.rows, p.heads * p.head_dim]), memref([p.kv_rows, p.kv_heads * p.head_dim])
    types = [q_ty, kv_ty, kv_ty, memref([1], "i32"), q_ty]
    mod, la = frame(KIND, p, types, scale_dim)
    return mod, types, la


def _prefill(p: planner.AttentionPlan, scale_dim: int | None) -> str:

    hd, lq, lk, ir = p.head_dim, p.lq, p.lk, p.item_rows
    X, Y, G = p.herd_x, p.herd_y, p.group
    qw = p.heads * hd
    ext = attention_prefill_kernels(hd, lq, lk, p.window, scale_dim, p.qcycle)
    mod, types, la = _module(p, scale_dim)
    q_ty, kv_ty = types[0], types[1]
    item_ty, qt_ty = memref([ir, hd], "bf16", L1), memref([lq, hd], "bf16", L1)
    st_ty = memref([p.state_floats], "f32", L1)
    mod.declare(ext.init.symbol, ext.obj, [st_ty, qt_ty])
    mod.declare(ext.update.symbol, ext.obj, [item_ty, qt_ty, st_ty, "i32", "i32", "i32", "i32"])
    mod.declare(ext.out.symbol, ext.obj, [st_ty, qt_ty])
    ch_fk = mod.channel("attn_fk", [1, 1])             # feed of item rows [0, lk): the Q stream, then K
    ch_fv = mod.channel("attn_fv", [1, 1])             # ... of item rows [lk, 2lk): the Q stream, then V
    ch_pos = mod.channel("attn_pos", [1, 1], [X, Y])
    ch_in = mod.channel("attn_in", [1, 1], [X, Y])     # the item stream reaches every core
    ch_o = mod.channel("attn_o", [X, Y])               # core (x, y)'s output tile -> query block x's L2 buffer

    _feed(la, p, ch_fk, ch_fv, q_ty, kv_ty)   # ---- launch: the Q stream and the K / V windows on the feeds

    # ---- segment: one uniform item loop: both halves from the feeds into one L2 item, one broadcast put
    seg = segment_of(la, types)
    s = seg.body
    sq, sk, sv, spos, so, sg, srd, shs = seg.args
    send_position(s, ch_pos, spos)
    item2_ty = memref([ir, hd], "bf16", L2)
    sl, _ = s.for_(0, p.steps, 1, "t")
    it2 = sl.alloc("item_l2", item2_ty)
    # the memory tile writes each incoming half 8x8-blocked into the item ([2lk/8][hd/8][8][8], each block
    # row-major: the layout attention.cc's block-float path reads; as mlir-air's npu2 attention blocks K and V by
    # DMA): row r, column c of the half at (r/8)*8hd + (c/8)*64 + (r%8)*8 + c%8. (The same blocking on the
    # broadcast put's side made air-to-aie run for hours at 96 items per loop.)
    for ch, r0 in ((ch_fk, 0), (ch_fv, lk)):
        sl.channel_get(ch, [0, 0], it2, item2_ty, ([r0 // 8, 0, 0, 0], [lk // 8, 8, hd // 8, 8], [8 * hd, 8, 64, 1]))
    sl.channel_put(ch_in, [0, 0], it2, item2_ty, None)
    sl.dealloc(it2, item2_ty)
    _prefill_herd(s, srd, p, ext, (ch_pos, ch_in, ch_o), (item_ty, qt_ty, st_ty))   # ---- herd

    # ---- segment, after the herd: per query block x, its herd_y output tiles side by side in one L2 buffer, then
    # ONE DMA to o (the memory-tile drain of kernels/gemm.py): its row blocks go to rows rd*X*lq + (x + i*X)*8
    out2_ty = memref([lq, Y * hd], "bf16", L2)
    shead0 = s.addi(s.muli(sg, G), s.muli(shs, Y))
    for x in range(X):
        o2 = s.alloc("out_l2", out2_ty)
        for y in range(Y):
            # tile y at columns y*hd: a 3-d pattern whose stepping dimension (stride hd) is no dimension of the
            # buffer, so air-split-l2-memref does not cut the buffer into herd_y pieces with an L3 write each
            s.channel_get(ch_o, [x, y], o2, out2_ty, ([0, y, 0], [lq, 1, hd], [Y * hd, hd, 1]))
        blk0 = s.muli(srd, lq // 8)                      # rd*X*lq rows = (rd*lq/8) strides of 8X rows
        s.dma(so, q_ty, ([blk0, 8 * x, s.muli(shead0, hd)], [lq // 8, 8, Y * hd], [8 * X * qw, qw, 1]),
              o2, out2_ty, None)
        s.dealloc(o2, out2_ty)
    return mod.text()


def _feed(la, p: planner.AttentionPlan, ch_fk: str, ch_fv: str, q_ty: str, kv_ty: str) -> None:
    """The prefill launch (iteration = kv head g, round rd, head pass hs): on each feed channel (one shim stream
    each), one put of the round's Q stream and one put of the whole K (V) window; the segment's gets take them an
    item half at a time. The Q stream is the round's X*lq rows of each of the Y heads, head-major: item rows
    [0, lk) of every item on feed k, [lk, 2lk) on feed v (X*lq is a multiple of 2lk: the plan). No loops here:
    each put is one shim BD (air-opt-shim-dma-bds folds a loop into a BD only when the loop variable is an
    offset by itself)."""
    hd, lq, lk, X, Y, G = p.head_dim, p.lq, p.lk, p.herd_x, p.herd_y, p.group
    qw, kw = p.heads * hd, p.kv_heads * hd
    rl = la.body
    q, k, v, pos, o = la.args
    g, rd, hs = la.ids
    head0 = rl.addi(rl.muli(g, G), rl.muli(hs, Y))       # the query head of core y = 0
    per_head = p.q_items_per_head
    for f, ch, src in ((0, ch_fk, k), (1, ch_fv, v)):
        if X * lq == lk:   # one item per head: both halves carry the head's rows (the second is never kept)
            offs, sizes, strides = [head0, rd, 0, 0], [Y, 1, lk, hd], [hd, lk * qw, qw, 1]
        else:
            offs, sizes, strides = [head0, rl.muli(rd, per_head), f * lk, 0], [Y, per_head, lk, hd], \
                [hd, 2 * lk * qw, qw, 1]
        rl.channel_put(ch, [0, 0], q, q_ty, (offs, sizes, strides))
        if p.q_items > Y * per_head:   # the pad item (no core keeps it): the item loops get an even trip count
            rl.channel_put(ch, [0, 0], q, q_ty, (offs, [1, 1] + sizes[2:], strides))
        rl.channel_put(ch, [0, 0], src, kv_ty, ([0, g, 0], [p.kv_rows, 1, hd], [kw, hd, 1]))


def _prefill_herd(s, srd: str, p: planner.AttentionPlan, ext, channels: tuple, l1_types: tuple) -> None:
    """The prefill herd, per launch iteration: Q capture, the window's tiles, finish, the output tile to L2."""
    ch_pos, ch_in, ch_o = channels
    item_ty, qt_ty, st_ty = l1_types
    lq, lk, X, Y = p.lq, p.lk, p.herd_x, p.herd_y
    h = herd(s, "attention_herd", (X, Y), [(srd, "index")], [f'link_with = "{ext.obj}"'])
    hb = h.body
    tx, ty = h.ids
    (hrd,) = h.args
    pos_i32 = receive_position(hb, ch_pos, tx, ty, p)
    # core (x, y) keeps the Q stream's 8-row blocks y*(per_head*2lk/8) + x + i*X (head y's rows, every X-th block)
    slot = i32(hb, hb.addi(hb.muli(ty, p.q_items_per_head * 2 * lk // 8), tx))
    n_q = hb.i32(p.q_items)
    # the Q/output tile and the state live outside the item loop (the only loop aircc should ping-pong)
    qt, st = hb.alloc("q_l1", qt_ty), hb.alloc("state_l1", st_ty)
    hb.call(ext.init.symbol, [(st, st_ty), (qt, qt_ty)])
    first_row = hb.addi(hb.muli(hrd, X * lq), hb.muli(tx, 8))   # this core's first row in the chunk
    q_pos0 = hb.value("i", f"arith.addi {pos_i32}, {i32(hb, first_row)} : i32")
    il, it = hb.for_(0, p.steps, 1, "t")
    item = il.alloc("item_l1", item_ty)
    il.channel_get(ch_in, [tx, ty], item, item_ty, None)
    il.call(ext.update.symbol, [(item, item_ty), (qt, qt_ty), (st, st_ty), (i32(il, it), "i32"), (n_q, "i32"),
                                (slot, "i32"), (q_pos0, "i32")])
    il.dealloc(item, item_ty)
    hb.call(ext.out.symbol, [(st, st_ty), (qt, qt_ty)])  # the output tile replaces the Q tile
    hb.channel_put(ch_o, [tx, ty], qt, qt_ty, None)
    hb.dealloc(qt, qt_ty)
    hb.dealloc(st, st_ty)


def _decode(p: planner.AttentionPlan, scale_dim: int | None) -> str:

    hd, lk, ir = p.head_dim, p.lk, p.item_rows
    X, Y, G = p.herd_x, p.herd_y, p.group
    qw, kw = p.heads * hd, p.kv_heads * hd
    ext = attention_decode_kernels(hd, p.lq, lk, X, p.window, scale_dim)
    mod, types, la = _module(p, scale_dim)
    seg = segment_of(la, types)
    q_ty, kv_ty = types[0], types[1]
    c = decode_channels(mod, ext, p, memref([ir, hd], "bf16", L1))

    s = seg.body
    q, k, v, pos, o, gi = seg.args                       # gi: this launch iteration's first kv head / herd_y
    send_position(s, c.ch_pos, pos)
    g0 = s.muli(gi, Y)

    # ---- segment: per K/V tile step, per split x: the K and V rows of the herd_y kv heads (one DMA each) and
    # their groups' query rows (one DMA) -> one L2 item [2lk + group, herd_y * hd] -> core (x, y) gets its kv
    # head's columns. The loop variable is the first key of the tile within a split; the split is its own
    # dimension and kv head g0 its own offset (loop variables appear as offsets of their own dimension for the
    # shim BD folding)
    tl, key = s.for_(0, p.share, lk, "key")
    kv2_ty = memref([ir, Y * hd], "bf16", L2)
    for x in range(X):
        kv2 = tl.alloc("kv_l2", kv2_ty)
        for half, src in ((0, k), (lk, v)):
            tl.dma(kv2, kv2_ty, ([half, 0], [lk, Y * hd], [Y * hd, 1]), src, kv_ty,
                   ([x, key, g0, 0], [1, lk, Y, hd], [p.share * kw, kw, hd, 1]))
        # query row r of kv head y's group (head (g0 + y)*G + r) -> item row 2lk + r, columns y*hd
        tl.dma(kv2, kv2_ty, ([2 * lk, 0, 0], [G, Y, hd], [Y * hd, hd, 1]), q, q_ty,
               ([0, 0, g0, 0], [1, G, Y, hd], [qw, hd, G * hd, 1]))
        for y in range(Y):
            tl.channel_put(c.ch_in, [x, y], kv2, kv2_ty, ([0, y * hd], [ir, hd], [Y * hd, 1]))
        tl.dealloc(kv2, kv2_ty)

    decode_cores(s, c, p, o, q_ty, g0)   # the split herd, the partials through L2, the merge herd
    return mod.text()
