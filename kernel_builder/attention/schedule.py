"""The parts of the attention kernels' schedules more than one builder emits: the module / launch / segment frame,
the position's broadcast to every core, and the flash-decoding tail that the bf16 decode (attention/builder.py
`_decode`) and the KV8 decode (attention_kv8/builder.py) share - they differ only in their item streams.

The flash-decoding tail (`decode_channels`, then the builder's item stream, then `decode_cores`): a herd of
herd_x splits of the window x herd_y kv heads, each core folding its share of its kv head's window into an
online-softmax partial (one `update` call per item received on @attn_in[x, y]) and sending it to L2
(@attn_part); per kv head y the segment gathers its herd_x partials into one L2 buffer and puts them on
@attn_merge[0, y]; merge core y combines them and writes its group's output rows to L3 with one DMA.
"""
from __future__ import annotations

from dataclasses import dataclass

from kernel_builder.emit import L1, L2, Module, attr_dict, herd, launch, memref, segment


def frame(kind: str, p, types: list[str], scale_dim: int | None):
    """The module of `kind` over the function arguments `types` and its launch (grid p.launch_grid), the launch
    carrying the kernel's shape as its attribute dictionary."""
    mod = Module(kind, types)
    params = {"rows": p.rows, "kv_rows": p.kv_rows, "heads": p.heads, "kv_heads": p.kv_heads, "head_dim": p.head_dim,
              **({"window": p.window} if p.window else {}), **({"scale_dim": scale_dim} if scale_dim else {})}
    la = launch(mod.body, list(p.launch_grid), list(zip(mod.args, types)), [attr_dict(kind, params)])
    return mod, la


def segment_of(la, types: list[str]):
    """The segment (after any launch-level ops already emitted into the launch body); its trailing operands
    are the launch ids."""
    return segment(la.body, "attention_seg", list(zip(la.args, types)) + [(i, "index") for i in la.ids])


def send_position(s, ch_pos: str, pos_l3: str) -> None:
    """The segment puts pos from L3 straight on the broadcast channel to every core of the herd (one shim
    stream, no L2 buffer: the memory tiles stay for the item, output and partial buffers - a ninth L2 buffer
    made air-to-aie place two on one memory tile, over its 6 S2MM channels)."""
    s.channel_put(ch_pos, [0, 0], pos_l3, memref([1], "i32"), None)


def receive_position(hb, ch_pos: str, tx: str, ty: str, p) -> str:
    """A core receives the position into L1 (4 bytes) and loads it: the i32 SSA value. The load records the
    positions the shape admits (`llama_npu.range`, inclusive): a chunk of `rows` rows ends inside the window,
    so pos <= kv_rows - rows (decode: kv_rows - 1)."""
    pos1_ty = memref([1], "i32", L1)
    pos1 = hb.alloc("pos_l1", pos1_ty)
    hb.channel_get(ch_pos, [tx, ty], pos1, pos1_ty, None)
    top = p.kv_rows - p.rows
    return hb.value("pos", f"memref.load {pos1}[{hb.idx(0)}] {{llama_npu.range = [0, {top}]}} : {pos1_ty}")


def i32(b, v: str) -> str:
    return b.value("i", f"arith.index_cast {v} : index to i32")


@dataclass(frozen=True)
class DecodeChannels:
    """The flash-decoding tail's L1 types, external kernels and channels (declared by `decode_channels`)."""

    ext: object
    item_ty: str
    st_ty: str
    parts_ty: str
    out_ty: str
    ch_pos: str
    ch_in: str
    ch_part: str
    ch_merge: str


def decode_channels(mod, ext, p, item_ty: str) -> DecodeChannels:
    """Declares the decode kernels `ext` (init / update over an L1 item of `item_ty` / out) and the channels:
    the position's broadcast, one item stream and one partial per core, one merge input per kv head."""
    X, Y = p.herd_x, p.herd_y
    st_ty = memref([p.state_floats], "f32", L1)
    parts_ty, out_ty = memref([X * p.state_floats], "f32", L1), memref([p.lq, p.head_dim], "bf16", L1)
    mod.declare(ext.init.symbol, ext.obj, [st_ty])
    mod.declare(ext.update.symbol, ext.obj, [item_ty, st_ty, "i32", "i32"])
    mod.declare(ext.out.symbol, ext.obj, [parts_ty, out_ty])
    return DecodeChannels(ext, item_ty, st_ty, parts_ty, out_ty, mod.channel("attn_pos", [1, 1], [X, Y]),
                          mod.channel("attn_in", [X, Y]), mod.channel("attn_part", [X, Y]),
                          mod.channel("attn_merge", [1, Y]))


def decode_cores(s, c: DecodeChannels, p, o: str, q_ty: str, g0: str) -> None:
    """After the segment's item stream: the split herd, the partials through L2 and the merge herd (module doc);
    `o` is the output in L3 (of `q_ty`), `g0` the launch iteration's first kv head."""
    hd, lk, X, Y, G = p.head_dim, p.lk, p.herd_x, p.herd_y, p.group
    ext, item_ty, st_ty, parts_ty, out_ty = c.ext, c.item_ty, c.st_ty, c.parts_ty, c.out_ty
    # ---- herd: each core's share of its kv head's window into an online-softmax partial
    h = herd(s, "attention_herd", (X, Y), [], [f'link_with = "{ext.obj}"'])
    hb = h.body
    tx, ty = h.ids
    pos_i32 = receive_position(hb, c.ch_pos, tx, ty, p)
    st = hb.alloc("state_l1", st_ty)
    hb.call(ext.init.symbol, [(st, st_ty)])
    share0 = hb.muli(tx, p.share)
    il, it = hb.for_(0, p.kv_tiles, 1, "t")
    item = il.alloc("item_l1", item_ty)
    il.channel_get(c.ch_in, [tx, ty], item, item_ty, None)
    k_pos0 = i32(il, il.addi(share0, il.muli(it, lk)))
    il.call(ext.update.symbol, [(item, item_ty), (st, st_ty), (pos_i32, "i32"), (k_pos0, "i32")])
    il.dealloc(item, item_ty)
    hb.channel_put(c.ch_part, [tx, ty], st, st_ty, None)
    hb.dealloc(st, st_ty)

    # ---- segment: per kv head y, its herd_x partials L1 -> L2 -> merge core y
    p2_ty = memref([X * p.state_floats], "f32", L2)
    for y in range(Y):
        p2 = s.alloc("parts_l2", p2_ty)
        for x in range(X):
            s.channel_get(c.ch_part, [x, y], p2, p2_ty, ([x * p.state_floats], [p.state_floats], [1]))
        s.channel_put(c.ch_merge, [0, y], p2, p2_ty, None)
        s.dealloc(p2, p2_ty)

    # ---- merge herd: combine each kv head's partials, write its group's output rows
    mh = herd(s, "attention_merge", (1, Y), [(o, q_ty), (g0, "index")], [f'link_with = "{ext.obj}"'])
    mb = mh.body
    mx, my = mh.ids
    o_l3, mg0 = mh.args
    parts, out = mb.alloc("parts_l1", parts_ty), mb.alloc("out_l1", out_ty)
    mb.channel_get(c.ch_merge, [mx, my], parts, parts_ty, None)
    mb.call(ext.out.symbol, [(parts, parts_ty), (out, out_ty)])
    col = mb.muli(mb.addi(mg0, my), G * hd)
    mb.dma(o_l3, q_ty, ([0, col], [1, G * hd], [p.heads * hd, 1]), out, out_ty, None)
    mb.dealloc(parts, parts_ty)
    mb.dealloc(out, out_ty)
