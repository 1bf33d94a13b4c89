"""The numerics of attention.cc's block-float prefill path (docs/hardware-model.md, "Attention numerics").

The emulator computes attention with the f32 contract (kernel_builder.reference.attention); the chip's prefill
path rounds Q.K^T and P.V through bfp16ebs8 (8 values share an exponent). kernel_builder.reference.
attention_block_float models that arithmetic (the host aie_api run of the vector path matches it:
tests/test_aie_host_kernels.py); here the emulator runs the model in place of the f32 reference for every prefill
chunk (decode keeps its f32 path, as the kernel does) and the verify gate must still pass: on the embedded
SmolLM2 (`make verify`'s prompts) and on a random 2-layer checkpoint at Llama-3.2-1B widths.
"""
from __future__ import annotations

import numpy as np
import pytest

from kernel_builder import reference as ref
from kernel_builder.attention.reference import attention, attention_block_float
from kernel_builder.numerics import to_bf16
from tooling import require_module

LLAMA32_1B_2L = dict(hidden=2048, n_heads=32, n_kv_heads=8, head_dim=64, ffn=8192, n_layers=2, vocab=512, seed=21)


def _block_float_prefill(q, k, v, pos, **kw):
    if kw["rows"] == 1:          # decode: attention.cc's f32 dot products, no block float
        return attention(q, k, v, pos, **kw)
    return attention_block_float(q, k, v, pos, **kw)


def _rel(got, want):
    g, w = got.astype(np.float64), want.astype(np.float64)
    return np.abs(g - w).mean() / np.abs(w).mean()


def test_block_float_model_error_against_the_f32_reference():
    """Scores of std ~1 (a prefill chunk over a KV prefix, GQA): the block-float model stays within 2 % mean
    relative of the f32 reference; with the block float taken out (both operands exact) it is the bf16 rounding of
    the scaled Q and of the probabilities only."""
    rng = np.random.default_rng(0)
    rows, kv_rows, heads, kv_heads, hd = 96, 160, 4, 2, 64
    q = to_bf16(rng.standard_normal((rows, heads * hd)).astype(np.float32))
    k = to_bf16(rng.standard_normal((kv_rows, kv_heads * hd)).astype(np.float32))
    v = to_bf16(rng.standard_normal((kv_rows, kv_heads * hd)).astype(np.float32))
    kw = dict(rows=rows, kv_rows=kv_rows, heads=heads, kv_heads=kv_heads, head_dim=hd)
    want = attention(q, k, v, 64, **kw)
    got = attention_block_float(q, k, v, 64, **kw)
    assert 1e-3 < _rel(got, want) < 2e-2
    assert _rel(attention_block_float(q, k, v, 64, lk=16, **kw), want) < 2e-2   # the tile length barely matters
    with pytest.raises(ValueError, match="outside"):
        attention_block_float(q, k, v, kv_rows, **kw)


def test_smollm2_passes_the_verify_gate_with_block_float_attention(monkeypatch, tmp_path):
    require_module("torch")
    from verify import cli

    monkeypatch.setitem(ref.KERNELS, "attention", _block_float_prefill)
    # `make verify`'s prompts and rule (2 prompts x 32 tokens, top-5); their 18 and 40 tokens need bucket 64 only
    argv = ["verify", "--device", "emu", "--buckets", "64", "--report-dir", str(tmp_path / "report")]
    assert cli.main(argv) == 0


def test_llama_1b_widths_pass_the_verify_gate_with_block_float_attention(hf_checkpoint, tmp_path, monkeypatch):
    require_module("torch")
    from llama_npu import embedded
    from verify import cli

    monkeypatch.setattr(embedded, "cache_root", lambda: tmp_path)   # this model's own compiled-module store
    monkeypatch.setitem(ref.KERNELS, "attention", _block_float_prefill)
    model_dir = hf_checkpoint(**LLAMA32_1B_2L)
    argv = ["verify", "--model", str(model_dir), "--device", "emu", "--buckets", "64", "--n-tokens", "8",
            "--report-dir", str(tmp_path / "report")]
    assert cli.main(argv) == 0
