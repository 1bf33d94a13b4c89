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
from kernel_builder.emit import L1, L2, Module, attr_dict, herd, launch, memref, segment

KIND = "attention"


def build(rows: int, kv_rows: int, heads: int, kv_heads: int, head_dim: int, window: int | None = None,
          scale_dim: int | None = None) -> str:
    """`window` (None: full causal): a sliding window of keys per query; `scale_dim` (None: head_dim): the
    softmax scale 1/sqrt(scale_dim). Both are compile-time constants of the external kernel."""
    p = planner.plan_attention(rows, kv_rows, heads, kv_heads, head_dim, window)
    scale_dim = None if scale_dim in (None, head_dim) else scale_dim
    return (_decode if p.decode else _prefill)(p, scale_dim)


def _module(p: planner.AttentionPlan, scale_dim: int | None):
    hd = p.head_dim
    q_ty, kv_ty = memref([p.rows, p.heads * hd]), memref([p.kv_rows, p.kv_heads * hd])
    types = [q_ty, kv_ty, kv_ty, memref([1], "i32"), q_ty]
    mod = Module(KIND, types)
    params = {"rows": p.rows, "kv_rows": p.kv_rows, "heads": p.heads, "kv_heads": p.kv_heads, "head_dim": hd,
              **({"window": p.window} if p.window else {}), **({"scale_dim": scale_dim} if scale_dim else {})}
    la = launch(mod.body, list(p.launch_grid), list(zip(mod.args, types)), [attr_dict(KIND, params)])
    return mod, types, la


def _segment(la, types):
    """The segment (after any launch-level ops already emitted into the launch body); its trailing operands
    are the launch ids."""
    return segment(la.body, "attention_seg", list(zip(la.args, types)) + [(i, "index") for i in la.ids])


def _send_position(s, ch_pos: str, pos_l3: str) -> None:
    """The segment puts pos from L3 straight on the broadcast channel to every core of the herd (one shim
    stream, no L2 buffer: the memory tiles stay for the item, output and partial buffers - a ninth L2 buffer
    made air-to-aie place two on one memory tile, over its 6 S2MM channels)."""
    s.channel_put(ch_pos, [0, 0], pos_l3, memref([1], "i32"), None)


def _receive_position(hb, ch_pos: str, tx: str, ty: str, p: planner.AttentionPlan) -> str:
    """A core receives the position into L1 (4 bytes) and loads it: the i32 SSA value. The load records the
    positions the shape admits (`llama_npu.range`, inclusive): a chunk of `rows` rows ends inside the window,
    so pos <= kv_rows - rows (decode: kv_rows - 1)."""
    pos1_ty = memref([1], "i32", L1)
    pos1 = hb.alloc("pos_l1", pos1_ty)
    hb.channel_get(ch_pos, [tx, ty], pos1, pos1_ty, None)
    top = p.kv_rows - p.rows
    return hb.value("pos", f"memref.load {pos1}[{hb.idx(0)}] {{llama_npu.range = [0, {top}]}} : {pos1_ty}")


def _i32(b, v: str) -> str:
    return b.value("i", f"arith.index_cast {v} : index to i32")


def _prefill(p: planner.AttentionPlan, scale_dim: int | None) -> str:

    hd, lq, lk, ir = p.head_dim, p.lq, p.lk, p.item_rows
    X, Y, G = p.herd_x, p.herd_y, p.group
    qw, kw = p.heads * hd, p.kv_heads * hd
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

    # ---- launch (iteration = kv head g, round rd, head pass hs): on each feed channel (one shim stream each),
    # one put of the round's Q stream and one put of the whole K (V) window; the segment's gets take them an
    # item half at a time. The Q stream is the round's X*lq rows of each of the Y heads, head-major: item rows
    # [0, lk) of every item on feed k, [lk, 2lk) on feed v (X*lq is a multiple of 2lk: the plan). No loops here:
    # each put is one shim BD (air-opt-shim-dma-bds folds a loop into a BD only when the loop variable is an
    # offset by itself).
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

    # ---- segment: one uniform item loop: both halves from the feeds into one L2 item, one broadcast put
    seg = _segment(la, types)
    s = seg.body
    sq, sk, sv, spos, so, sg, srd, shs = seg.args
    _send_position(s, ch_pos, spos)
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
    # ---- herd: per launch iteration, Q capture, the window's tiles, finish, the output tile to L2
    h = herd(s, "attention_herd", (X, Y), [(srd, "index")], [f'link_with = "{ext.obj}"'])
    hb = h.body
    tx, ty = h.ids
    (hrd,) = h.args
    pos_i32 = _receive_position(hb, ch_pos, tx, ty, p)
    # core (x, y) keeps the Q stream's 8-row blocks y*(per_head*2lk/8) + x + i*X (head y's rows, every X-th block)
    slot = _i32(hb, hb.addi(hb.muli(ty, p.q_items_per_head * 2 * lk // 8), tx))
    n_q = hb.i32(p.q_items)
    # the Q/output tile and the state live outside the item loop (the only loop aircc should ping-pong)
    qt, st = hb.alloc("q_l1", qt_ty), hb.alloc("state_l1", st_ty)
    hb.call(ext.init.symbol, [(st, st_ty), (qt, qt_ty)])
    first_row = hb.addi(hb.muli(hrd, X * lq), hb.muli(tx, 8))   # this core's first row in the chunk
    q_pos0 = hb.value("i", f"arith.addi {pos_i32}, {_i32(hb, first_row)} : i32")
    il, it = hb.for_(0, p.steps, 1, "t")
    item = il.alloc("item_l1", item_ty)
    il.channel_get(ch_in, [tx, ty], item, item_ty, None)
    il.call(ext.update.symbol, [(item, item_ty), (qt, qt_ty), (st, st_ty), (_i32(il, it), "i32"), (n_q, "i32"),
                                (slot, "i32"), (q_pos0, "i32")])
    il.dealloc(item, item_ty)
    hb.call(ext.out.symbol, [(st, st_ty), (qt, qt_ty)])  # the output tile replaces the Q tile
    hb.channel_put(ch_o, [tx, ty], qt, qt_ty, None)
    hb.dealloc(qt, qt_ty)
    hb.dealloc(st, st_ty)

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


def _decode(p: planner.AttentionPlan, scale_dim: int | None) -> str:

    hd, lq, lk, ir = p.head_dim, p.lq, p.lk, p.item_rows
    X, Y, G = p.herd_x, p.herd_y, p.group
    qw, kw = p.heads * hd, p.kv_heads * hd
    ext = attention_decode_kernels(hd, lq, lk, X, p.window, scale_dim)
    mod, types, la = _module(p, scale_dim)
    seg = _segment(la, types)
    q_ty, kv_ty = types[0], types[1]
    item_ty, st_ty = memref([ir, hd], "bf16", L1), memref([p.state_floats], "f32", L1)
    parts_ty, out_ty = memref([X * p.state_floats], "f32", L1), memref([lq, hd], "bf16", L1)
    mod.declare(ext.init.symbol, ext.obj, [st_ty])
    mod.declare(ext.update.symbol, ext.obj, [item_ty, st_ty, "i32", "i32"])
    mod.declare(ext.out.symbol, ext.obj, [parts_ty, out_ty])
    ch_pos = mod.channel("attn_pos", [1, 1], [X, Y])
    ch_in = mod.channel("attn_in", [X, Y])
    ch_part = mod.channel("attn_part", [X, Y])
    ch_merge = mod.channel("attn_merge", [1, Y])

    s = seg.body
    q, k, v, pos, o, gi = seg.args                       # gi: this launch iteration's first kv head / herd_y
    _send_position(s, ch_pos, pos)
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
            tl.channel_put(ch_in, [x, y], kv2, kv2_ty, ([0, y * hd], [ir, hd], [Y * hd, 1]))
        tl.dealloc(kv2, kv2_ty)

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

    # ---- segment: per kv head y, its herd_x partials L1 -> L2 -> merge core y
    p2_ty = memref([X * p.state_floats], "f32", L2)
    for y in range(Y):
        p2 = s.alloc("parts_l2", p2_ty)
        for x in range(X):
            s.channel_get(ch_part, [x, y], p2, p2_ty, ([x * p.state_floats], [p.state_floats], [1]))
        s.channel_put(ch_merge, [0, y], p2, p2_ty, None)
        s.dealloc(p2, p2_ty)

    # ---- merge herd: combine each kv head's partials, write its group's output rows
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
