"""`make bench`, the 8-bit KV cache (`--kv int8`, docs/quantization.md "KV cache"): the modeled q4 decode token of
Llama-3.2-1B at a 32k context as one module (llama_npu/models/token.py; counted cost model, likely scenario, NPU
time) with the bf16 cache and with KV8, the KV bytes a token reads and the attention launches' share; and the
embedded model's perplexity on the fixed text of benchmarks/q4.py with its K and V (every layer, after RoPE)
through the KV8 format, beside bf16 (HF transformers, f32)."""
from __future__ import annotations

import numpy as np

GB = 1e9


def modeled_token(shapes, window: int, kv: str, weights: str = "q4"):
    """(modeled seconds, attention seconds, KV bytes read per token) of the one-module decode token."""
    from kernel_builder.hw import analyze_module, cost
    from kernel_builder.kv_quant.reference import row_bytes
    from llama_npu.models.llama import LlamaModel
    from llama_npu.models.token import token_module
    from multi_launch_builder.stitcher import stitch

    tok = token_module(LlamaModel(shapes, weights, kv=kv), window)
    rep = analyze_module(stitch(tok), tok.name)
    attn = sum(cost.launch_cost(la.work, rep.params).total_s for la in rep.launches
               if la.name.split(" @")[0] in ("attention", "attention_kv8", "kv_quant"))
    row = row_bytes(shapes.n_kv_heads, shapes.head_dim) if kv == "int8" else 4 * shapes.kv_dim
    return rep.modeled_s, attn, shapes.n_layers * window * row, rep.ok


def bench_kv8_memory(context: int = 32768) -> None:
    """Device buffers (the memory plan: the ModuleExecutor's allocation) of Llama-3.2-1B q4 with each cache."""
    from llama_npu.memory import plan_memory
    from llama_npu.models.llama import LLAMA32_1B

    buckets = (64, 256, 1024, 2048)
    parts = []
    for kv in ("bf16", "int8"):
        p = plan_memory(LLAMA32_1B, buckets, context, weights="q4", kv=kv)
        parts.append(f"{kv}: weights {p.weights_bytes / 2**30:.2f} + KV cache {p.kv_cache_bytes / 2**30:.2f} + "
                     f"scratch {p.scratch_bytes / 2**30:.2f} + activations {p.activation_bytes / 2**30:.2f} = "
                     f"{p.total / 2**30:.2f} GiB")
    print(f"[bench] device buffers Llama-3.2-1B q4 (buckets {list(buckets)}, context {context}) with the KV cache in "
          + "; ".join(parts))


def bench_kv8_decode(window: int = 32768) -> dict:
    from llama_npu.models.llama import LLAMA32_1B

    bench_kv8_memory(window)
    out = {}
    for kv in ("bf16", "int8"):
        out[kv] = modeled_token(LLAMA32_1B, window, kv)
    (b, ba, bb, bok), (k, ka, kb, kok) = out["bf16"], out["int8"]
    ctx = f"{window // 1024}k" if window % 1024 == 0 else str(window)
    print(f"[bench] modeled q4 decode Llama-3.2-1B at a {ctx} context, one module per token (likely, NPU time): "
          f"bf16 KV cache ({bb / GB:.2f} GB read per token) {b * 1e3:.1f} ms = {1 / b:.1f} tok/s (attention "
          f"{ba * 1e3:.1f} ms); KV8 ({kb / GB:.2f} GB) {k * 1e3:.1f} ms = {1 / k:.1f} tok/s (attention + K/V "
          f"quantization {ka * 1e3:.1f} ms); target >= 36 tok/s; hardware model {'ok' if bok and kok else 'VIOLATION'}")
    return out


def kv8_roundtrip(x):
    """A [batch, kv_heads, seq, head_dim] tensor's values through the KV8 format (per position and kv head)."""
    import torch

    from kernel_builder.kv_quant.reference import dequantize, quantize
    b, h, s, d = x.shape
    rows = x.detach().to(torch.float32).permute(0, 2, 1, 3).reshape(b * s, h * d).numpy()
    codes, scales = quantize(rows, h, d)
    back = dequantize(codes, scales, h, d).reshape(b, s, h, d)
    return torch.from_numpy(np.ascontiguousarray(back)).permute(0, 2, 1, 3).to(x.dtype)


def bench_kv8_perplexity(model_dir=None) -> dict:
    """Perplexity of benchmarks.q4.PPL_TEXT under HF transformers (f32, eager attention) with bf16 K/V and with
    every layer's K (after RoPE) and V through the KV8 format (our cache holds exactly those values)."""
    import torch
    import transformers
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    from benchmarks.q4 import PPL_TEXT, _ppl
    from llama_npu.embedded import ensure_embedded

    def kv8_attention(module, query, key, value, *args, **kwargs):
        return sdpa_attention_forward(module, query, kv8_roundtrip(key), kv8_roundtrip(value), *args, **kwargs)

    AttentionInterface.register("llama_npu_kv8", kv8_attention)
    path = model_dir or ensure_embedded(progress=False)
    tok = transformers.AutoTokenizer.from_pretrained(path)
    ids = tok(PPL_TEXT, return_tensors="pt").input_ids
    out = {}
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32,
                                                              attn_implementation="sdpa").eval()
    for label, impl in (("bf16 KV", "sdpa"), ("KV8", "llama_npu_kv8")):
        model.set_attn_implementation(impl)
        out[label] = _ppl(model, ids, torch)
    print(f"[bench] perplexity of the embedded model on the fixed text (HF, f32, {ids.shape[1]} tokens): bf16 KV "
          f"{out['bf16 KV']:.3f}, KV8 (K after RoPE and V through int8 codes + power-of-two scales) "
          f"{out['KV8']:.3f} (delta {out['KV8'] - out['bf16 KV']:+.3f})")
    return out


if __name__ == "__main__":
    bench_kv8_decode()
    bench_kv8_perplexity()
