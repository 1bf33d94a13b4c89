"""End-to-end wiring check of the derived modules: one layer of every phase, run module by module on the
emu device (stitched text -> launch program -> numpy references) through the runtime's own walk
(llama_npu.walk.run_layers), equals the Llama layer composed by hand from the references - bit for bit,
including the K/V rows the modules append to the device cache. A deliberately mis-wired declaration must
change the result, so a wiring bug cannot hide."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from threadpoolctl import threadpool_limits

from multi_launch_builder.compile import build_modules
from multi_launch_builder.executor import ModuleExecutor
from multi_launch_builder.decl import ModuleDecl, Role
from multi_launch_builder.devices.emu import EmuDevice
from kernel_builder.numerics import to_bf16
from kernel_builder.reference import KERNELS as K, decode_attn, flash_attn
from llama_npu.walk import run_layers
from llama_npu.host_attention import HostAttention
from llama_npu.models.graph import PhasePlan
from llama_npu.models.llama import SMOLLM2_135M, LlamaModel, QKNormLlama
from llama_npu.rope import rope_lut
from kernel_builder.gemm_swiglu.layout import interleave

SEQ, CAP = 16, 32
SHAPES = dataclasses.replace(SMOLLM2_135M, vocab=4000, n_layers=1)
S = SHAPES
H, Q, KV, F, HD, EPS = S.hidden, S.q_dim, S.kv_dim, S.ffn, S.head_dim, S.rms_eps


def _weights(model, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    out = {}
    for name, (_, shape) in model.layer_tensors().items():
        scale = 1.0 if len(shape) == 1 else 0.05
        out[name] = to_bf16(rng.standard_normal(shape, dtype=np.float32) * scale)
    out["w_gate_up"] = interleave(out["w_gate"], out["w_up"])   # the bf16 graph's one gate/up static
    return out


def _layer(w: dict, x: np.ndarray, pos: int, k_hist: np.ndarray, v_hist: np.ndarray, qk_norm: bool):
    """The Llama layer on rows x at positions pos.., composed by hand: every named tensor + the new K/V rows.
    BLAS runs single-threaded, as on the emu device (the thread split changes f32 summation order)."""
    with threadpool_limits(1, user_api="blas"):
        return _layer_math(w, x, pos, k_hist, v_hist, qk_norm)


def _layer_math(w, x, pos, k_hist, v_hist, qk_norm):
    r = x.shape[0]
    lut = rope_lut(np.arange(pos, pos + r), HD, 10000.0)
    t = {"h": K["rmsnorm"](x, w["attn_norm"], rows=r, dim=H, eps=EPS)}
    lin = (lambda a, wt, n, k: K["gemv"](wt, a, m=n, k=k)) if r == 1 else \
        (lambda a, wt, n, k: K["gemm"](a, wt, m=r, k=k, n=n))
    q, k, v = lin(t["h"], w["wq"], Q, H), lin(t["h"], w["wk"], KV, H), lin(t["h"], w["wv"], KV, H)
    if qk_norm:
        q = K["rmsnorm"](q, w["q_norm"], rows=r, dim=Q, eps=EPS, group=HD)
        k = K["rmsnorm"](k, w["k_norm"], rows=r, dim=KV, eps=EPS, group=HD)
    t["q_roped"] = K["rope"](q, lut, rows=r, heads=S.n_heads, head_dim=HD)
    k_new = K["rope"](k, lut, rows=r, heads=S.n_kv_heads, head_dim=HD)
    keys, vals = np.concatenate([k_hist, k_new]), np.concatenate([v_hist, v])
    if r == 1:
        t["attn"] = decode_attn(t["q_roped"], keys, vals, pos, kv_rows=pos + 1, heads=S.n_heads,
                                     kv_heads=S.n_kv_heads, head_dim=HD)
    else:
        t["attn"] = flash_attn(t["q_roped"], keys, vals, seq=r, heads=S.n_heads, kv_heads=S.n_kv_heads,
                                    head_dim=HD, causal=1)
    # a residual add: decode fuses it into the GEMV's epilogue (gemv_bias: added in f32, one rounding)
    res = (lambda a, wt, n, k, b: K["gemv_bias"](wt, a, b, m=n, k=k)) if r == 1 else \
        (lambda a, wt, n, k, b: K["add"](b, lin(a, wt, n, k), rows=r, dim=n))
    res1 = res(t["attn"], w["wo"], H, Q, x)
    h2 = K["rmsnorm"](res1, w["ffn_norm"], rows=r, dim=H, eps=EPS)
    act = K["swiglu"](lin(h2, w["w_gate"], F, H), lin(h2, w["w_up"], F, H), rows=r, dim=F)
    t["x_out"] = res(act, w["w_down"], H, F, res1)
    return t, k_new, v


def _same(a, b) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    return a.size == b.size and np.array_equal(a.reshape(-1).view(np.uint16), b.reshape(-1).view(np.uint16))


def _run(tmp_path, model, plan: PhasePlan, w: dict, x: np.ndarray, pos: int, history=None):
    """One layer of `plan` through ModuleExecutor + emu, as the engine runs it. Returns (layer output, reads,
    K rows, V rows of the cache)."""
    decls = plan.decls
    arts = build_modules(decls, tmp_path, "emu", progress=False).artifacts
    kc = ModuleExecutor(EmuDevice(), arts, decls)
    for name in ("k_cache", "v_cache"):
        kc.define_state(name, CAP)
    kc.define_state("rope", CAP, per_key=False)
    kc.write_state("rope", rope_lut(np.arange(CAP), HD, 10000.0))
    if history is not None:
        kc.write_state("k_cache", history[0], bo_key="L0")
        kc.write_state("v_cache", history[1], bo_key="L0")
    for d in decls:
        statics = {a: (np.ascontiguousarray(w[a[:-2]].T) if a.endswith("_t") else w[a])
                   for a in d.names(Role.STATIC)}
        kc.write_static(d.name, bo_key="L0", **statics)
    host = HostAttention(1, S.n_heads, S.n_kv_heads, HD)
    reads = {}

    def host_op(step, layer, p, results):
        (src,) = step.inputs.values()
        reads["q_roped"] = results[src.step][src.arg]
        return host.attend(kc, layer, p, results[src.step][src.arg])

    (out,) = run_layers(kc, plan, x, pos, 1, host_op, read_last=True)
    n = pos + x.shape[0]
    return out, reads, kc.read_state("k_cache", "L0", 0, n), kc.read_state("v_cache", "L0", 0, n)


@pytest.mark.parametrize("variant", [LlamaModel, QKNormLlama], ids=["llama", "qk_norm"])
def test_prefill_layer_equals_hand_composed_layer(tmp_path, variant):
    model = variant(SHAPES)
    w = _weights(model, seed=1)
    x = to_bf16(np.random.default_rng(2).standard_normal((SEQ, H), dtype=np.float32))
    want, k_new, v_new = _layer(w, x, 0, np.zeros((0, KV), x.dtype), np.zeros((0, KV), x.dtype),
                                variant.qk_norm)
    out, _, k_rows, v_rows = _run(tmp_path, model, model.prefill(SEQ), w, x, 0)
    assert _same(out, want["x_out"])
    assert _same(k_rows, k_new) and _same(v_rows, v_new)       # the K/V append landed in the device cache
    assert np.any(want["x_out"].astype(np.float32) != 0)


@pytest.mark.parametrize("variant", [LlamaModel, QKNormLlama], ids=["llama", "qk_norm"])
def test_decode_layer_equals_hand_composed_layer(tmp_path, variant):
    model = variant(SHAPES)
    w = _weights(model, seed=3)
    rng = np.random.default_rng(4)
    pos = 5
    hist = [to_bf16(rng.standard_normal((CAP, KV), dtype=np.float32)) for _ in range(2)]
    x = to_bf16(rng.standard_normal((1, H), dtype=np.float32))
    want, k_new, v_new = _layer(w, x, pos, hist[0][:pos], hist[1][:pos], variant.qk_norm)
    out, reads, k_rows, v_rows = _run(tmp_path, model, model.decode(), w, x, pos, history=hist)
    assert _same(out, want["x_out"]) and _same(reads["q_roped"], want["q_roped"])
    assert _same(k_rows[pos], k_new) and _same(v_rows[pos], v_new)
    assert _same(k_rows[:pos], hist[0][:pos])                  # the history is untouched


def _swap(decl: ModuleDecl, prefix_a: str, prefix_b: str, pos) -> ModuleDecl:
    """Swap argument `pos` between the wirings of two launches (or, pos = (i, j), two arguments of one launch)."""
    if isinstance(pos, tuple):
        la = next(l for l in decl.launches if l.prefix == prefix_a)
        w = list(la.wiring)
        w[pos[0]], w[pos[1]] = w[pos[1]], w[pos[0]]
        return dataclasses.replace(decl, launches=tuple(dataclasses.replace(l, wiring=tuple(w)) if l is la else l
                                                        for l in decl.launches))
    la = next(l for l in decl.launches if l.prefix == prefix_a)
    lb = next(l for l in decl.launches if l.prefix == prefix_b)
    wa, wb = list(la.wiring), list(lb.wiring)
    wa[pos], wb[pos] = wb[pos], wa[pos]
    swapped = {prefix_a: dataclasses.replace(la, wiring=tuple(wa)), prefix_b: dataclasses.replace(lb, wiring=tuple(wb))}
    return dataclasses.replace(decl, launches=tuple(swapped.get(l.prefix, l) for l in decl.launches))


def _replace_step(plan: PhasePlan, index: int, decl: ModuleDecl) -> PhasePlan:
    steps = list(plan.steps)
    steps[index] = dataclasses.replace(steps[index], decl=decl)
    return dataclasses.replace(plan, steps=tuple(steps))


@pytest.mark.parametrize("phase, step, a, b, pos", [
    ("prefill", 0, "k", "v_new", 1),         # qkv: wk <-> wv
    # (ffn: the gate and up weights are ONE interleaved static w_gate_up: no two weights left to swap)
], ids=["qkv-wk-wv"])
def test_miswired_declaration_changes_the_result(tmp_path, phase, step, a, b, pos):
    model = LlamaModel(SHAPES)
    plan = model.prefill(SEQ) if phase == "prefill" else model.decode()
    bad = _replace_step(plan, step, _swap(plan.steps[step].decl, a, b, pos))
    w = _weights(model, seed=5)
    rows = SEQ if phase == "prefill" else 1
    x = to_bf16(np.random.default_rng(6).standard_normal((rows, H), dtype=np.float32))
    good = _run(tmp_path / "good", model, plan, w, x, 0)
    wrong = _run(tmp_path / "bad", model, bad, w, x, 0)
    assert not _same(good[0], wrong[0])
    if step == 0:
        assert not _same(good[2], wrong[2]) or not _same(good[3], wrong[3])
