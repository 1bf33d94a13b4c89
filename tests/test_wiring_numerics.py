"""End-to-end wiring check: each stitched module, executed launch by launch from its TEXT
(read_launch_program + run_program + ReferenceExecutor, exactly what the emu device does), equals the layer
math composed by hand from the numpy references - bit for bit. A deliberately mis-wired declaration must
give a different result, so a wiring bug cannot hide."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from kernel_builder.launch_program import ReferenceExecutor, read_launch_program, run_program
from kernel_builder.numerics import to_bf16
from kernel_builder.reference import KERNELS as K
from kernel_builder.stitching import stitch
from multi_launch_builder.decl import ModuleDecl, Role
from multi_launch_builder.registry import decode_modules, prefill_modules
from multi_launch_builder.shapes import SMOLLM2_135M

SEQ = 16
# SmolLM2-135M dimensions; a smaller vocabulary keeps the LM-head weights small (still several partitions).
SHAPES = dataclasses.replace(SMOLLM2_135M, vocab=4000)
S = SHAPES
H, Q, KV, F, HD, EPS = S.hidden, S.q_dim, S.kv_dim, S.ffn, S.head_dim, S.rms_eps


def _feeds(decl: ModuleDecl, seed: int) -> dict[str, np.ndarray]:
    """Random bf16 data for every input/static argument (weights scaled like real ones)."""
    rng = np.random.default_rng(seed)
    out = {}
    for a in decl.args:
        if a.role in (Role.INPUT, Role.STATIC):
            scale = 1.0 if len(a.shape) == 1 or a.shape[0] <= SEQ else 0.05
            out[a.name] = to_bf16(rng.standard_normal(a.shape, dtype=np.float32) * scale)
    return out


def _run(decl: ModuleDecl, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    prog = read_launch_program(stitch(decl))
    bufs = [feeds[a.name] if a.name in feeds else np.zeros(a.shape, dtype=to_bf16(0).dtype) for a in decl.args]
    run_program(prog, bufs, ReferenceExecutor())
    return {a.name: b for a, b in zip(decl.args, bufs)}


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    return a.size == b.size and np.array_equal(a.reshape(-1).view(np.uint16), b.reshape(-1).view(np.uint16))


# ---- the layer math, composed by hand -----------------------------------------------------------------

def _rms_gemms_rope(f, seq):
    normed = K["rmsnorm"](f["x"], f["norm_w"], rows=seq, dim=H, eps=EPS)
    q = K["gemm"](normed, f["wq"], m=seq, k=H, n=Q)
    k = K["gemm"](normed, f["wk"], m=seq, k=H, n=KV)
    v = K["gemm"](normed, f["wv"], m=seq, k=H, n=KV)
    return {"normed": normed, "q": q, "k": k, "v": v,
            "q_roped": K["rope"](q, f["lut"], rows=seq, heads=S.n_heads, head_dim=HD),
            "k_roped": K["rope"](k, f["lut"], rows=seq, heads=S.n_kv_heads, head_dim=HD)}


def _flash_attn(f, seq):
    return {"attn": K["flash_attn"](f["q"], f["k"], f["v"], seq=seq, heads=S.n_heads, kv_heads=S.n_kv_heads,
                                    head_dim=HD, causal=1)}


def _o_ffn(f, seq):
    proj = K["gemm"](f["attn"], f["wo"], m=seq, k=Q, n=H)
    res1 = K["add"](f["x"], proj, rows=seq, dim=H)
    normed2 = K["rmsnorm"](res1, f["ffn_norm_w"], rows=seq, dim=H, eps=EPS)
    gate = K["gemm"](normed2, f["w_gate"], m=seq, k=H, n=F)
    up = K["gemm"](normed2, f["w_up"], m=seq, k=H, n=F)
    act = K["swiglu"](gate, up, rows=seq, dim=F)
    down = K["gemm"](act, f["w_down"], m=seq, k=F, n=H)
    return {"proj": proj, "res1": res1, "normed2": normed2, "gate": gate, "up": up, "hidden_act": act,
            "down": down, "x_out": K["add"](res1, down, rows=seq, dim=H, flat_out=1)}


def _rms_gemv_rope(f, _):
    normed = K["rmsnorm"](f["x"], f["norm_w"], rows=1, dim=H, eps=EPS)
    q = K["gemv"](f["wq"], normed, m=Q, k=H)
    k = K["gemv"](f["wk"], normed, m=KV, k=H)
    return {"normed": normed, "q": q, "k": k, "v": K["gemv"](f["wv"], normed, m=KV, k=H),
            "q_roped": K["rope"](q, f["lut"], rows=1, heads=S.n_heads, head_dim=HD),
            "k_roped": K["rope"](k, f["lut"], rows=1, heads=S.n_kv_heads, head_dim=HD)}


def _o_gemv_ffn(f, _):
    proj = K["gemv"](f["wo"], f["attn"], m=H, k=Q)
    res1 = K["add"](f["x"], proj, rows=1, dim=H)
    normed2 = K["rmsnorm"](res1, f["ffn_norm_w"], rows=1, dim=H, eps=EPS)
    gate = K["gemv"](f["w_gate"], normed2, m=F, k=H)
    up = K["gemv"](f["w_up"], normed2, m=F, k=H)
    act = K["swiglu"](gate, up, rows=1, dim=F)
    down = K["gemv"](f["w_down"], act, m=H, k=F)
    return {"proj": proj, "res1": res1, "normed2": normed2, "gate": gate, "up": up, "hidden_act": act,
            "down": down, "x_out": K["add"](res1, down, rows=1, dim=H)}


def _lm_head(f, _):
    out = {}
    for name, w in f.items():
        if name.startswith("w_"):
            out["logits_" + name[2:]] = K["gemv"](w, f["x"], m=w.shape[0], k=H)
    return out


HAND = {"rms_gemms_rope": _rms_gemms_rope, "flash_attn": _flash_attn, "o_ffn": _o_ffn,
        "rms_gemv_rope": _rms_gemv_rope, "o_gemv_ffn": _o_gemv_ffn, "lm_head_gemv": _lm_head}
DECLS = prefill_modules(SHAPES, SEQ) + decode_modules(SHAPES)


def _hand_name(decl: ModuleDecl) -> str:
    return decl.name.removesuffix(f"_s{SEQ}")


@pytest.mark.parametrize("decl", DECLS, ids=[d.name for d in DECLS])
def test_stitched_module_equals_hand_composed_references(decl):
    feeds = _feeds(decl, seed=len(decl.name))
    got = _run(decl, feeds)
    want = HAND[_hand_name(decl)](feeds, SEQ)
    produced = set(decl.names(Role.OUTPUT, Role.INTERMEDIATE))
    assert set(want) == produced
    for name, expected in want.items():
        assert got[name].shape == decl.arg(name).shape, name
        assert _same(got[name], expected), f"{decl.name}: {name} differs from the hand-composed reference"
        assert np.any(np.asarray(expected, dtype=np.float32) != 0), name  # a trivially zero check proves nothing


def _swap(decl: ModuleDecl, prefix_a: str, prefix_b: str, pos: int) -> ModuleDecl:
    """Swap argument `pos` between the wirings of two launches."""
    la = next(l for l in decl.launches if l.prefix == prefix_a)
    lb = next(l for l in decl.launches if l.prefix == prefix_b)
    wa, wb = list(la.wiring), list(lb.wiring)
    wa[pos], wb[pos] = wb[pos], wa[pos]
    swapped = {prefix_a: dataclasses.replace(la, wiring=tuple(wa)), prefix_b: dataclasses.replace(lb, wiring=tuple(wb))}
    return dataclasses.replace(decl, launches=tuple(swapped.get(l.prefix, l) for l in decl.launches))


@pytest.mark.parametrize("index, a, b, pos, changed", [
    (0, "k", "v", 1, ("k_roped", "v")),          # rms_gemms_rope: wk <-> wv
    (2, "gate", "up", 1, ("x_out",)),            # o_ffn: w_gate <-> w_up
    (4, "gate", "up", 0, ("x_out",)),            # o_gemv_ffn: w_gate <-> w_up
], ids=["rms_gemms_rope-wk-wv", "o_ffn-gate-up", "o_gemv_ffn-gate-up"])
def test_miswired_declaration_changes_the_result(index, a, b, pos, changed):
    decl = DECLS[index]
    bad = _swap(decl, a, b, pos)
    assert bad.launches != decl.launches
    feeds = _feeds(decl, seed=7)
    good, wrong = _run(decl, feeds), _run(bad, feeds)
    for name in changed:
        assert not _same(good[name], wrong[name]), f"swapping {a}/{b} did not change {name}"
