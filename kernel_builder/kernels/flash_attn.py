"""Flash attention (causal, GQA): for query head h (kv head g = h // (heads // kv_heads)),
    o[:, h] = softmax(q[:, h] @ k[:, g]^T / sqrt(head_dim) + causal_mask) @ v[:, g]
computed tile by tile with an online softmax (running max m, running sum l, f32 accumulator acc).

MLIR + external C++ tile primitives (kernel_builder.externals.attention_kernels: init / step / finish, the
scale and the causal mask live in `step`). air.launch over the kv heads -> segment -> herd [herd_q, herd_h]:
x splits the query blocks of a head (interleaved, so causal work is balanced), y runs herd_h query heads of
the same GQA group side by side (they read the same K/V tiles). With causal=1 a query block at q0 only
visits key blocks below q0 + lq (lk divides lq).
"""
from __future__ import annotations

from .. import planner
from ._emit import L1, Module, attr_dict, herd, launch, memref, segment

KIND = "flash_attn"


def build(seq: int, heads: int, kv_heads: int, head_dim: int, causal: bool = True) -> str:
    from .. import externals

    p = planner.plan_flash_attn(seq, heads, kv_heads, head_dim)
    ext = externals.attention_kernels(head_dim, p.lq, p.lk)
    objs = {ext.init.obj, ext.step.obj, ext.finish.obj}
    if len(objs) != 1:  # a herd links exactly one object
        raise ValueError(f"flash_attn: attention primitives must share one object file, got {sorted(objs)}")
    obj = objs.pop()
    hd, group = head_dim, heads // kv_heads
    qw, kw = heads * hd, kv_heads * hd
    q_ty, kv_ty = memref([seq, qw]), memref([seq, kw])
    ql_ty, kl_ty = memref([p.lq, hd], "bf16", L1), memref([p.lk, hd], "bf16", L1)
    ml_ty, acc_ty = memref([p.lq], "f32", L1), memref([p.lq, hd], "f32", L1)
    mod = Module(KIND, [q_ty, kv_ty, kv_ty, q_ty])
    mod.declare(ext.init.symbol, obj, [ml_ty, ml_ty, acc_ty])
    mod.declare(ext.step.symbol, obj, [ql_ty, kl_ty, kl_ty, ml_ty, ml_ty, acc_ty, "i32", "i32", "i32"])
    mod.declare(ext.finish.symbol, obj, [ml_ty, acc_ty, ql_ty])
    types = [q_ty, kv_ty, kv_ty, q_ty]

    params = {"seq": seq, "heads": heads, "kv_heads": kv_heads, "head_dim": hd, "causal": bool(causal)}
    la = launch(mod.body, [kv_heads], list(zip(mod.args, types)), [attr_dict(KIND, params)])
    seg = segment(la.body, "flash_attn_seg", list(zip(la.args, types)) + [(la.ids[0], "index")])
    h = herd(seg.body, "flash_attn_herd", (p.herd_q, p.herd_h), list(zip(seg.args, types + ["index"])),
             [f'link_with = "{obj}"'])
    b = h.body
    q, k, v, o, g = h.args
    tq, th = h.ids
    kv_col = b.muli(g, hd)
    head0 = b.addi(b.muli(g, group), th)

    hloop, hh = b.for_(0, group, p.herd_h, "hh")
    head = hloop.addi(head0, hh)
    q_col = hloop.muli(head, hd)
    q0_first = hloop.muli(tq, p.lq)
    qloop, q0 = hloop.for_(q0_first, seq, p.herd_q * p.lq, "q0")
    ql, ol = qloop.alloc("q_l1", ql_ty), qloop.alloc("o_l1", ql_ty)
    m_, l_, acc = qloop.alloc("m_l1", ml_ty), qloop.alloc("l_l1", ml_ty), qloop.alloc("acc_l1", acc_ty)
    qloop.dma(ql, ql_ty, None, q, q_ty, ([q0, q_col], [p.lq, hd], [qw, 1]))
    qloop.call(ext.init.symbol, [(m_, ml_ty), (l_, ml_ty), (acc, acc_ty)])
    k_end = qloop.addi(q0, p.lq) if causal else seq
    q0_i32 = qloop.value("q0_i32", f"arith.index_cast {q0} : index to i32")
    kloop, k0 = qloop.for_(0, k_end, p.lk, "k0")
    kl, vl = kloop.alloc("k_l1", kl_ty), kloop.alloc("v_l1", kl_ty)
    kloop.dma(kl, kl_ty, None, k, kv_ty, ([k0, kv_col], [p.lk, hd], [kw, 1]))
    kloop.dma(vl, kl_ty, None, v, kv_ty, ([k0, kv_col], [p.lk, hd], [kw, 1]))
    k0_i32 = kloop.value("k0_i32", f"arith.index_cast {k0} : index to i32")
    kloop.call(ext.step.symbol, [(ql, ql_ty), (kl, kl_ty), (vl, kl_ty), (m_, ml_ty), (l_, ml_ty),
                                 (acc, acc_ty), (q0_i32, "i32"), (k0_i32, "i32"),
                                 (kloop.i32(int(bool(causal))), "i32")])
    kloop.dealloc(kl, kl_ty)
    kloop.dealloc(vl, kl_ty)
    qloop.call(ext.finish.symbol, [(l_, ml_ty), (acc, acc_ty), (ol, ql_ty)])
    qloop.dma(o, q_ty, ([q0, q_col], [p.lq, hd], [qw, 1]), ol, ql_ty, None)
    for buf, ty in ((ql, ql_ty), (ol, ql_ty), (m_, ml_ty), (l_, ml_ty), (acc, acc_ty)):
        qloop.dealloc(buf, ty)
    return mod.text()
