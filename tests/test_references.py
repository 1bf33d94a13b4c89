"""kernel_builder.reference against float64 math and against Hugging Face's Llama building blocks.

Tolerances: outputs are bf16 (8 significant bits, relative spacing 2^-8..2^-7). A reference is "close" when
every element is within BF16_REL = 2^-7 (two bf16 ulps at the element's magnitude) of the float64 result plus
a small absolute slack proportional to the output scale (for f32 accumulation error near cancellation).
Where the float32 computation is provably identical to HF's (RoPE in f32, rope LUT), equality is exact.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
from tooling import require_module

from kernel_builder import reference as ref
from kernel_builder.attention import reference as attention_ref
from kernel_builder.gemm import reference as gemm_ref
from kernel_builder.numerics import BF16, to_bf16
from llama_npu.rope import rope_inv_freq, rope_lut

BF16_REL = 2.0**-7


def rand_bf16(rng, shape, scale=1.0) -> np.ndarray:
    return to_bf16(rng.standard_normal(shape).astype(np.float32) * np.float32(scale))


def f64(x) -> np.ndarray:
    return np.asarray(x).astype(np.float64)


def assert_bf16_close(out, exact, abs_slack_rel=2.0**-12):
    """|out - exact| <= 2^-7 |exact| + abs_slack_rel * max|exact|   (and out is bf16)."""
    assert out.dtype == BF16
    out64, exact = f64(out), np.asarray(exact, dtype=np.float64)
    assert out64.shape == exact.shape
    bound = BF16_REL * np.abs(exact) + abs_slack_rel * np.abs(exact).max()
    err = np.abs(out64 - exact)
    worst = np.unravel_index(np.argmax(err - bound), err.shape)
    assert np.all(err <= bound), f"at {worst}: got {out64[worst]}, exact {exact[worst]}, bound {bound[worst]}"


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


# ------------------------------------------------------------------------------------------ matmuls

@pytest.mark.parametrize("k", [2048, 8192])
def test_gemm_matches_float64(rng, k):
    m, n = 8, 48
    a, w = rand_bf16(rng, (m, k)), rand_bf16(rng, (n, k), 0.02)   # w in the HF [out, in] layout
    out = ref.gemm(a, w, m=m, k=k, n=n)
    assert out.shape == (m, n)
    assert_bf16_close(out, f64(a) @ f64(w).T)


def test_gemm_rows_do_not_depend_on_m(rng):
    """A row's result is bit-identical whatever the number of rows around it (prefill padding invariance):
    the reference computes in fixed 64-row blocks."""
    k, n = 576, 192
    w = rand_bf16(rng, (n, k), 0.05)
    a = rand_bf16(rng, (200, k))
    full = ref.gemm(a, w, m=200, k=k, n=n)
    for m in (1, 7, 64, 65, 130):
        part = ref.gemm(a[:m], w, m=m, k=k, n=n)
        np.testing.assert_array_equal(part.view(np.uint16), full[:m].view(np.uint16))


def test_gemm_on_the_emulator_pool_gives_the_serial_bits(rng, monkeypatch):
    """Large GEMMs run their 64-row blocks on kernel_builder.host_threads' pool: same bits as one thread."""
    m, k, n = 1000, 576, 640
    assert m * k * n >= gemm_ref._GEMM_PARALLEL_MIN_MACS
    w, a = rand_bf16(rng, (n, k), 0.05), rand_bf16(rng, (m, k))
    monkeypatch.setenv("LLAMA_NPU_EMU_THREADS", "1")
    serial = ref.gemm(a, w, m=m, k=k, n=n)
    monkeypatch.setenv("LLAMA_NPU_EMU_THREADS", "4")
    pooled = ref.gemm(a, w, m=m, k=k, n=n)
    np.testing.assert_array_equal(pooled.view(np.uint16), serial.view(np.uint16))


@pytest.mark.parametrize("k", [2048, 8192])
def test_gemv_matches_float64_and_accepts_f32_and_flat_inputs(rng, k):
    m = 96
    w, x = rand_bf16(rng, (m, k), 0.02), rand_bf16(rng, (1, k))
    out = ref.gemv(w, x, m=m, k=k)
    assert out.shape == (1, m)
    assert_bf16_close(out, (f64(w) @ f64(x).reshape(k)).reshape(1, m))
    # float32 arrays holding the same bf16 values, flat views: identical result
    same = ref.gemv(w.astype(np.float32).reshape(-1), x.astype(np.float32).reshape(k), m=m, k=k)
    np.testing.assert_array_equal(same.view(np.uint16), out.view(np.uint16))


def test_references_do_not_mutate_inputs(rng):
    a = rand_bf16(rng, (4, 64)).astype(np.float32)
    b = rand_bf16(rng, (4, 64)).astype(np.float32)
    a0, b0 = a.copy(), b.copy()
    ref.add(a, b, rows=4, dim=64)
    ref.swiglu(a, b, rows=4, dim=64)
    ref.rmsnorm(a, b[0], rows=4, dim=64, eps=1e-5)
    lut = rope_lut(np.arange(4), 32, 10000.0)
    ref.rope(a, lut, rows=4, heads=2, head_dim=32)
    np.testing.assert_array_equal(a, a0)
    np.testing.assert_array_equal(b, b0)


# ------------------------------------------------------------------------------------------ elementwise

def test_rmsnorm_matches_float64(rng):
    rows, dim, eps = 5, 2048, 1e-5
    x, w = rand_bf16(rng, (rows, dim), 3.0), rand_bf16(rng, (dim,))
    out = ref.rmsnorm(x, w, rows=rows, dim=dim, eps=eps)
    x64 = f64(x)
    exact = x64 / np.sqrt((x64**2).mean(axis=1, keepdims=True) + eps) * f64(w)
    assert_bf16_close(out, exact)


def test_rmsnorm_matches_hf_llama_rmsnorm_bf16(rng):
    torch = require_module("torch")
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    rows, dim, eps = 6, 576, 1e-5
    x, w = rand_bf16(rng, (rows, dim), 2.0), rand_bf16(rng, (dim,))
    norm = LlamaRMSNorm(dim, eps=eps).to(torch.bfloat16)
    with torch.no_grad():
        norm.weight.copy_(torch.from_numpy(w.astype(np.float32)).to(torch.bfloat16))
        hf = norm(torch.from_numpy(x.astype(np.float32)).to(torch.bfloat16)).float().numpy()
    out = ref.rmsnorm(x, w, rows=rows, dim=dim, eps=eps)
    # HF rounds twice (normalised x to bf16, then w*x); we round once: at most 2 bf16 ulps apart.
    assert_bf16_close(out, hf, abs_slack_rel=0.0)
    assert np.mean(f64(out) == hf) > 0.7


def test_swiglu_matches_float64(rng):
    rows, dim = 3, 8192
    g, u = rand_bf16(rng, (rows, dim), 4.0), rand_bf16(rng, (rows, dim))
    out = ref.swiglu(g, u, rows=rows, dim=dim)
    g64 = f64(g)
    assert_bf16_close(out, g64 / (1 + np.exp(-g64)) * f64(u))


def test_swiglu_extreme_gate_values_stay_finite():
    g = to_bf16(np.array([[-1e30, -100.0, 0.0, 100.0, 1e30]], dtype=np.float32))
    u = to_bf16(np.ones((1, 5), dtype=np.float32))
    out = ref.swiglu(g, u, rows=1, dim=5).astype(np.float32)[0]
    assert np.all(np.isfinite(out))
    np.testing.assert_allclose(out, [0.0, 0.0, 0.0, 100.0, float(to_bf16(1e30))], rtol=1e-2)


def test_add_and_flat_out(rng):
    a, b = rand_bf16(rng, (3, 2048)), rand_bf16(rng, (3, 2048))
    out = ref.add(a, b, rows=3, dim=2048)
    assert out.shape == (3, 2048)
    # a + b of two bf16 values is exact in f32, so the single rounding equals rounding the exact sum
    np.testing.assert_array_equal(out.view(np.uint16), to_bf16(f64(a) + f64(b)).view(np.uint16))
    flat = ref.add(a.reshape(-1), b, rows=3, dim=2048, flat_out=1)
    assert flat.shape == (3 * 2048,)
    np.testing.assert_array_equal(flat.reshape(3, 2048).view(np.uint16), out.view(np.uint16))


# ------------------------------------------------------------------------------------------ RoPE

LLAMA3_SCALING = {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                  "original_max_position_embeddings": 8192}
HIGH_POSITIONS = np.array([0, 1, 2, 17, 1000, 8000, 8191, 8192, 65535, 131000, 131071])


def test_rope_matches_float64_rotation(rng):
    rows, heads, hd = 5, 4, 64
    x = rand_bf16(rng, (rows, heads * hd))
    lut = rope_lut(np.arange(100, 100 + rows), hd, 10000.0)
    out = ref.rope(x, lut, rows=rows, heads=heads, head_dim=hd)
    x3, l64 = f64(x).reshape(rows, heads, hd), f64(lut)[:, None, :]
    c, s = l64[..., :32], l64[..., 32:]
    exact = np.concatenate([x3[..., :32] * c - x3[..., 32:] * s, x3[..., 32:] * c + x3[..., :32] * s], -1)
    assert_bf16_close(out, exact.reshape(rows, heads * hd))


def _hf_llama_config(hd, theta, scaling):
    from transformers import LlamaConfig

    return LlamaConfig(hidden_size=hd * 4, num_attention_heads=4, num_key_value_heads=2, head_dim=hd,
                       rope_theta=theta, rope_scaling=scaling, max_position_embeddings=131072)


@pytest.mark.parametrize("theta,scaling,hd", [(10000.0, None, 64), (500000.0, LLAMA3_SCALING, 64),
                                               (500000.0, LLAMA3_SCALING, 128), (100000.0, None, 64)])
def test_rope_lut_equals_hf_rotary_embedding(theta, scaling, hd):
    torch = require_module("torch")
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    cfg = _hf_llama_config(hd, theta, scaling)
    rot = LlamaRotaryEmbedding(cfg)
    x = torch.zeros(1, len(HIGH_POSITIONS), hd, dtype=torch.bfloat16)
    cos, sin = rot(x, torch.from_numpy(HIGH_POSITIONS)[None])
    lut = rope_lut(HIGH_POSITIONS, hd, theta, scaling)
    assert lut.dtype == BF16 and lut.shape == (len(HIGH_POSITIONS), hd)
    half = hd // 2
    # HF: emb = cat(freqs, freqs); our row keeps one copy of cos and one of sin, from the same f32 expressions. But
    # torch's vectorised pow (SLEEF, picked by the CPU's ISA: AVX2 vs AVX-512) and numpy's powf may differ by up to two
    # f32 ulps in an inverse frequency; position p turns that into an angle error of 2 p ulp. Allowed: that angle error
    # plus one bf16 ulp of rounding (2^-8 at |x| <= 1); nearly every entry must still be bit-equal.
    inv = rot.inv_freq.float().numpy()
    np.testing.assert_array_max_ulp(rope_inv_freq(hd, theta, scaling), inv, maxulp=2)
    atol = HIGH_POSITIONS[:, None].astype(np.float64) * 2 * np.spacing(inv)[None, :] + 2.0 ** -8
    for ours, theirs in ((lut[:, :half], cos[0, :, :half]), (lut[:, half:], sin[0, :, :half])):
        ours, theirs = ours.astype(np.float64), theirs.double().numpy()
        assert np.all(np.abs(ours - theirs) <= atol), np.abs(ours - theirs).max()
        assert np.mean(ours == theirs) > 0.95


def test_llama3_inv_freq_equals_transformers_rope_init():
    torch = require_module("torch")
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    cfg = _hf_llama_config(64, 500000.0, LLAMA3_SCALING)
    inv, attention_factor = ROPE_INIT_FUNCTIONS["llama3"](cfg, torch.device("cpu"))
    assert attention_factor == 1.0
    # within two f32 ulps (torch's vectorised pow vs numpy's powf, see above)
    np.testing.assert_array_max_ulp(rope_inv_freq(64, 500000.0, LLAMA3_SCALING), inv.numpy(), maxulp=2)
    # the scaling really changes the low frequencies (guards against silently ignoring rope_scaling)
    assert not np.array_equal(rope_inv_freq(64, 500000.0, None), inv.numpy())


@pytest.mark.parametrize("dtype_name", ["float32", "bfloat16"])
def test_rope_equals_hf_apply_rotary_pos_emb(rng, dtype_name):
    torch = require_module("torch")
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    rows, heads, hd = len(HIGH_POSITIONS), 3, 64
    x = rand_bf16(rng, (rows, heads * hd), 2.0)
    lut = rope_lut(HIGH_POSITIONS, hd, 500000.0, LLAMA3_SCALING)
    out = ref.rope(x, lut, rows=rows, heads=heads, head_dim=hd)

    dt = getattr(torch, dtype_name)
    lut_t = torch.from_numpy(lut.astype(np.float32))
    cos = torch.cat([lut_t[:, :32], lut_t[:, :32]], -1)[None].to(dt)  # [1, rows, hd]
    sin = torch.cat([lut_t[:, 32:], lut_t[:, 32:]], -1)[None].to(dt)
    q = torch.from_numpy(x.astype(np.float32)).reshape(1, rows, heads, hd).transpose(1, 2).to(dt)  # [b, h, s, d]
    q_emb, _ = apply_rotary_pos_emb(q, q, cos, sin)
    hf = q_emb.transpose(1, 2).reshape(rows, heads * hd).float()
    if dtype_name == "float32":  # HF in f32 then one bf16 rounding: the same operations as ours -> equal bits
        hf_bf16 = to_bf16(hf.numpy())
        np.testing.assert_array_equal(out.view(np.uint16), hf_bf16.view(np.uint16))
    else:  # HF in bf16 rounds three times: within 2 bf16 ulps of ours
        assert_bf16_close(out, hf.numpy(), abs_slack_rel=2.0**-9)


def test_rope_lut_rejects_unknown_scaling():
    with pytest.raises(ValueError, match="rope_lut.*yarn"):
        rope_lut(np.arange(3), 64, 10000.0, {"rope_type": "yarn", "factor": 4.0})
    with pytest.raises(ValueError, match="llama3.*low_freq_factor"):
        rope_lut(np.arange(3), 64, 10000.0, {"rope_type": "llama3", "factor": 8.0})


# ------------------------------------------------------------------------------------------ attention

def attention_f64(q, k, v, seq, heads, kv_heads, hd, causal):
    """Per-head float64 loop: the obvious definition the vectorised reference must agree with."""
    q3, k3, v3 = (f64(t).reshape(seq, -1, hd) for t in (q, k, v))
    out = np.zeros((seq, heads, hd))
    for h in range(heads):
        kvh = h // (heads // kv_heads)
        s = q3[:, h] @ k3[:, kvh].T / math.sqrt(hd)
        if causal:
            s[np.triu(np.ones((seq, seq), dtype=bool), 1)] = -np.inf
        p = np.exp(s - s.max(axis=1, keepdims=True))
        out[:, h] = (p / p.sum(axis=1, keepdims=True)) @ v3[:, kvh]
    return out.reshape(seq, heads * hd)


@pytest.mark.parametrize("heads,kv_heads,causal", [(4, 2, 1), (6, 2, 1), (4, 4, 0), (8, 1, 1)])
def test_flash_attn_matches_float64_per_head_loop(rng, heads, kv_heads, causal):
    seq, hd = 40, 64
    q = rand_bf16(rng, (seq, heads * hd), 1.5)
    k = rand_bf16(rng, (seq, kv_heads * hd), 1.5)
    v = rand_bf16(rng, (seq, kv_heads * hd))
    out = ref.flash_attn(q, k, v, seq=seq, heads=heads, kv_heads=kv_heads, head_dim=hd, causal=causal)
    assert out.shape == (seq, heads * hd)
    exact = attention_f64(q, k, v, seq, heads, kv_heads, hd, causal)
    assert_bf16_close(out, exact, abs_slack_rel=2.0**-9)


def test_flash_attn_gqa_mapping_uses_consecutive_query_heads_per_kv_head(rng):
    """Query heads 0,1 read kv head 0 and heads 2,3 read kv head 1 (HF repeat_kv layout), not h % kv_heads."""
    seq, heads, kv_heads, hd = 8, 4, 2, 32
    q = rand_bf16(rng, (seq, heads * hd))
    k = rand_bf16(rng, (seq, kv_heads * hd))
    v = np.zeros((seq, kv_heads * hd), dtype=np.float32)
    v[:, :hd] = 1.0   # kv head 0 -> outputs 1
    v[:, hd:] = -1.0  # kv head 1 -> outputs -1
    out = ref.flash_attn(q, k, to_bf16(v), seq=seq, heads=heads, kv_heads=kv_heads, head_dim=hd, causal=1)
    per_head = out.astype(np.float32).reshape(seq, heads, hd)
    np.testing.assert_array_equal(per_head[:, :2], 1.0)
    np.testing.assert_array_equal(per_head[:, 2:], -1.0)


def test_flash_attn_causal_mask_ignores_future_keys(rng):
    seq, heads, kv_heads, hd, t = 24, 4, 2, 64, 10
    q = rand_bf16(rng, (seq, heads * hd))
    k, v = rand_bf16(rng, (seq, kv_heads * hd)), rand_bf16(rng, (seq, kv_heads * hd))
    k2, v2 = k.copy(), v.copy()
    k2[t + 1:] = rand_bf16(rng, (seq - t - 1, kv_heads * hd), 5.0)
    v2[t + 1:] = rand_bf16(rng, (seq - t - 1, kv_heads * hd), 5.0)
    kw = dict(seq=seq, heads=heads, kv_heads=kv_heads, head_dim=hd)
    a = ref.flash_attn(q, k, v, causal=1, **kw)
    b = ref.flash_attn(q, k2, v2, causal=1, **kw)
    np.testing.assert_array_equal(a[: t + 1].view(np.uint16), b[: t + 1].view(np.uint16))
    assert not np.array_equal(a[t + 1:], b[t + 1:])
    # without the mask the early rows do see the change
    assert not np.array_equal(ref.flash_attn(q, k, v, causal=0, **kw)[: t + 1],
                              ref.flash_attn(q, k2, v2, causal=0, **kw)[: t + 1])
    # row 0 attends only to key 0: its output is v[0] of its kv head
    np.testing.assert_array_equal(a[0].reshape(heads, hd)[0].view(np.uint16), v[0, :hd].view(np.uint16))


# ------------------------------------------------------------------------------------------ bad input

def test_kernels_registry_covers_every_kind():
    """One reference per registered kernel (the f64 flash_attn and decode_attn are references, not kernels)."""
    from kernel_builder.registry import KINDS, SIGNATURES
    assert list(ref.KERNELS) == list(SIGNATURES) == list(KINDS)


@pytest.mark.parametrize("heads,kv_heads,hd", [(6, 2, 64), (4, 4, 32), (8, 1, 128)])
def test_decode_attn_is_the_causal_flash_attention_row(heads, kv_heads, hd):
    """One query at position p against a KV window: bit-identical to row p of causal flash attention, and
    rows past p (whatever they hold) do not matter."""
    rng = np.random.default_rng(heads * hd)
    seq = 40
    q = to_bf16(rng.standard_normal((seq, heads * hd)))
    k = to_bf16(rng.standard_normal((seq, kv_heads * hd)))
    v = to_bf16(rng.standard_normal((seq, kv_heads * hd)))
    full = ref.flash_attn(q, k, v, seq=seq, heads=heads, kv_heads=kv_heads, head_dim=hd, causal=1)
    window = np.concatenate([k, to_bf16(rng.standard_normal((24, kv_heads * hd)) * 100)])
    vwin = np.concatenate([v, to_bf16(rng.standard_normal((24, kv_heads * hd)) * 100)])
    for p in (0, 1, 17, seq - 1):
        got = ref.decode_attn(q[p:p + 1], window, vwin, np.array([p], np.int32), kv_rows=64, heads=heads,
                              kv_heads=kv_heads, head_dim=hd)
        np.testing.assert_array_equal(got.view(np.uint16), full[p:p + 1].view(np.uint16))
    with pytest.raises(ValueError, match="outside the 64-row KV window"):
        ref.decode_attn(q[:1], window, vwin, 64, kv_rows=64, heads=heads, kv_heads=kv_heads, head_dim=hd)


@pytest.mark.parametrize("kind,args,params", [
    ("gemm", [(4, 8), (3, 8)], dict(m=4, k=8, n=4)),
    ("gemv", [(6, 16), (15,)], dict(m=6, k=16)),
    ("rmsnorm", [(2, 8), (9,)], dict(rows=2, dim=8, eps=1e-5)),
    ("rope", [(2, 64), (2, 16)], dict(rows=2, heads=2, head_dim=32)),
    ("swiglu", [(2, 8), (2, 7)], dict(rows=2, dim=8)),
    ("add", [(2, 8), (3, 8)], dict(rows=2, dim=8)),
    ("flash_attn", [(4, 64), (4, 32), (4, 31)], dict(seq=4, heads=2, kv_heads=1, head_dim=32, causal=1)),
])
def test_wrong_shapes_raise_value_error_naming_the_kernel(kind, args, params):
    arrays = [np.zeros(shape, dtype=np.float32) for shape in args]
    with pytest.raises(ValueError, match=rf"^{kind}: input \w+ has"):
        {**ref.KERNELS, "flash_attn": ref.flash_attn}[kind](*arrays, **params)


def test_bad_params_and_dtypes_raise_value_error():
    with pytest.raises(ValueError, match="gemv: parameter m"):
        ref.gemv(np.zeros(4, np.float32), np.zeros(4, np.float32), m=0, k=4)
    with pytest.raises(ValueError, match="flash_attn: heads=3 is not a multiple of kv_heads=2"):
        ref.flash_attn(*(np.zeros((2, 96), np.float32),) * 3, seq=2, heads=3, kv_heads=2, head_dim=32, causal=1)
    with pytest.raises(ValueError, match="add: input a must be bf16 or float32"):
        ref.add(np.zeros((2, 2), np.float64), np.zeros((2, 2), np.float32), rows=2, dim=2)
    with pytest.raises(ValueError, match="rope: head_dim=5 must be even"):
        ref.rope(np.zeros(5, np.float32), np.zeros(5, np.float32), rows=1, heads=1, head_dim=5)


def test_flash_attn_kv_head_batching_does_not_change_results(rng, monkeypatch):
    seq, heads, kv_heads, hd = 16, 8, 4, 32
    q = rand_bf16(rng, (seq, heads * hd))
    k, v = rand_bf16(rng, (seq, kv_heads * hd)), rand_bf16(rng, (seq, kv_heads * hd))
    kw = dict(seq=seq, heads=heads, kv_heads=kv_heads, head_dim=hd, causal=1)
    whole = ref.flash_attn(q, k, v, **kw)
    monkeypatch.setattr(attention_ref, "_SCORE_ELEMENTS_PER_BATCH", 1)  # one kv head per batch
    np.testing.assert_array_equal(ref.flash_attn(q, k, v, **kw).view(np.uint16), whole.view(np.uint16))
