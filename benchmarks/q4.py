"""`make bench`, 4-bit weights (docs/quantization.md): the device buffers of Llama-3.2-1B and Llama-3.1-8B shapes
in bf16 and q4 (group 32 with mins, as GGUF Q4_1 / `--weights q4`; group 128 as AWQ/GPTQ) from the memory plan
(the ModuleExecutor's allocation: weights, the q4 prefill scratch, the KV cache at 8k, activations); the modeled
decode token at a 1k context (kernel_builder.hw cost model, likely scenario: the bf16 and the q4 decode modules
as built, 17 dispatches per token); the modeled prefill of one Llama-3.2-1B layer in bf16 and q4 (the q4 modules
as built: gemm_q4 where the counted model prefers it, else each GEMM after its weight's dequant_q4; and with every
GEMM as gemm_q4); the embedded model's perplexity in bf16, native q4 and the q4 run."""
from __future__ import annotations

from kernel_builder.gemv_q4.format import Q4Layout

GiB = 2**30


def q4_weight_bytes(shapes, group: int = 32, mins: bool = True, tied: bool = False) -> int:
    """Every static buffer in q4: the linear weights and the vocabulary matrix (embedding and LM head: one copy
    when tied, two when not) as q4 rows; the norms bf16."""
    from llama_npu.models.llama import LlamaModel

    m = LlamaModel(shapes)
    s = shapes
    per_layer = 0
    for _, shape in m.layer_tensors().values():
        per_layer += shape[0] * Q4Layout(shape[1], group, mins).row_bytes if len(shape) == 2 else 2 * shape[0]
    vocab = s.vocab * Q4Layout(s.hidden, group, mins).row_bytes
    return s.n_layers * per_layer + 2 * s.hidden + vocab * (1 if tied else 2)


def kv_bytes(shapes, context: int) -> int:
    return shapes.n_layers * 2 * context * shapes.kv_dim * 2


def modeled_decode_s(shapes, window: int, q4: bool) -> float:
    """One decode token: n_layers x layer_kv<window> + lm_head, the modules as built (q4: the 4-bit decode layer,
    its GEMVs gemv_q4 with the fused residual / SwiGLU launches, and the q4 LM head)."""
    from kernel_builder.hw import analyze_module, cost
    from llama_npu.models.llama import LlamaModel
    from multi_launch_builder.stitcher import stitch

    m = LlamaModel(shapes, "q4" if q4 else "bf16")
    total = 0.0
    for decl, times in ((m.decode(window).decls[0], shapes.n_layers), (m.head().decls[0], 1)):
        rep = analyze_module(stitch(decl), decl.name)
        total += times * cost.module_seconds([la.work for la in rep.launches])
    return total


def modeled_prefill_layer_s(shapes, rows: int, weights: str) -> tuple[float, float]:
    """(seconds, of which dequant_q4 launches) of one layer's prefill modules for a chunk of `rows` tokens (cost
    model, likely scenario): bf16 GEMMs, or q4 (each GEMM preceded by its weight's dequant_q4 into the scratch)."""
    from kernel_builder.hw import analyze_module, cost
    from llama_npu.models.llama import LlamaModel
    from multi_launch_builder.stitcher import stitch

    total = deq = 0.0
    for decl in LlamaModel(shapes, weights).prefill(rows).decls:
        rep = analyze_module(stitch(decl), decl.name)
        total += cost.module_seconds([la.work for la in rep.launches])
        deq += sum(cost.launch_cost(la.work).total_s for launch, la in zip(decl.launches, rep.launches)
                   if launch.build.args[0] == "dequant_q4")
    return total, deq


def modeled_prefill_layer_l1_s(shapes, rows: int) -> float:
    """The same q4 layer with every remaining dequant_q4 + gemm pair priced as one gemm_q4 launch (the GEMM
    dequantizing its W slices in L1, kernel_builder/gemm_q4) at the same shape: every GEMM of the layer in L1, the
    counted model's figure for the choice the models do not make where it is slower (gemm_q4.plan.prefer_l1)."""
    from kernel_builder.hw import analyze_module, cost
    from kernel_builder.registry import kernel_text
    from llama_npu.models.llama import LlamaModel
    from multi_launch_builder.stitcher import stitch

    total = 0.0
    for decl in LlamaModel(shapes, "q4").prefill(rows).decls:
        rep = analyze_module(stitch(decl), decl.name)
        works, skip = [], False
        for launch, la in zip(decl.launches, rep.launches):
            args = launch.build.args
            if args[0] == "dequant_q4":
                n, k, g = args[1], args[2], args[3]
                works.append(analyze_module(kernel_text("gemm_q4", rows, k, n, g)).launches[0].work)
                skip = True
            elif skip and args[0] == "gemm":
                skip = False
            else:
                works.append(la.work)
        total += cost.module_seconds(works)
    return total


def bench_q4() -> None:
    from llama_npu.memory import plan_memory
    from llama_npu.models.llama import LLAMA31_8B, LLAMA32_1B

    buckets = (64, 256, 1024, 2048)
    for name, sh, tied in (("Llama-3.2-1B", LLAMA32_1B, True), ("Llama-3.1-8B", LLAMA31_8B, False)):
        for label, w, g in (("bf16", "bf16", None), ("q4 g32", "q4", 32), ("q4 g128", "q4", 128)):
            p = plan_memory(sh, buckets, 8192, weights=w, q4_group=g, tied=tied)
            emb = "" if tied else f", of which embedding + LM head rows {p.embed_bytes / GiB:.2f}"
            print(f"[bench] device buffers {name} ({'tied' if tied else 'untied'}) {label} (buckets {list(buckets)}, "
                  f"context 8k): weights + KV cache {(p.weights_bytes + p.kv_cache_bytes) / GiB:.2f} GiB{emb}; weights "
                  f"{p.weights_bytes / GiB:.2f} + prefill scratch {p.scratch_bytes / GiB:.2f} + KV cache "
                  f"{p.kv_cache_bytes / GiB:.2f} = {(p.weights_bytes + p.scratch_bytes + p.kv_cache_bytes) / GiB:.2f}"
                  f" GiB, + activations {p.activation_bytes / GiB:.2f} = {p.total / GiB:.2f} GiB")
    for name, sh in (("Llama-3.2-1B", LLAMA32_1B), ("Llama-3.1-8B", LLAMA31_8B)):
        b, q = modeled_decode_s(sh, 1024, False), modeled_decode_s(sh, 1024, True)
        print(f"[bench] modeled decode {name} at 1k context (likely, per-layer modules): bf16 {1 / b:.1f} tok/s, "
              f"q4 {1 / q:.1f} tok/s")
    for rows in (256, 2048):
        b, _ = modeled_prefill_layer_s(LLAMA32_1B, rows, "bf16")
        q, d = modeled_prefill_layer_s(LLAMA32_1B, rows, "q4")
        l1 = modeled_prefill_layer_l1_s(LLAMA32_1B, rows)
        print(f"[bench] modeled prefill Llama-3.2-1B, one layer, {rows}-token chunk (likely): bf16 "
              f"{b * 1e3:.2f} ms, q4 as built {q * 1e3:.2f} ms (gemm_q4 where the model prefers it; dequant_q4 into "
              f"the scratch {d * 1e3:.2f} ms), q4 with every GEMM as gemm_q4 {l1 * 1e3:.2f} ms")


def _mats(sh):
    from llama_npu.models.llama import LlamaModel
    return [t for t in LlamaModel(sh).layer_tensors().values() if len(t[1]) == 2]


PPL_TEXT = ("The city of Paris is the capital of France. It lies on the river Seine, in the north of the country. "
            "Paris is known for its museums, such as the Louvre, and for the Eiffel Tower, which was built for the "
            "world fair of 1889. About two million people live in the city itself, and more than ten million in "
            "its metropolitan area. The city is divided into twenty districts, called arrondissements.")


def _ppl(model, ids, torch) -> float:
    with torch.no_grad():
        return float(torch.exp(model(ids, labels=ids).loss))


def bench_q4_perplexity(model_dir=None) -> dict:
    """Perplexity of PPL_TEXT under HF transformers (f32) with the embedded model's weights as bf16 (the GGUF
    dequantized by transformers, f16 scales), as our native GGUF q4 load (bf16 scales and mins) and as
    `--weights q4` RTN (group 32) of the bf16 checkpoint: every linear weight of every layer replaced."""
    import torch
    import transformers

    from kernel_builder.gemv_q4.format import dequantize, quantize_rtn
    from llama_npu import quant
    from llama_npu.embedded import ensure_embedded, find_gguf

    path = model_dir or ensure_embedded(progress=False)
    tok = transformers.AutoTokenizer.from_pretrained(path)
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    ids = tok(PPL_TEXT, return_tensors="pt").input_ids
    cfg = model.config
    names = [n for n, p in model.named_parameters() if n.startswith("model.layers.") and p.dim() == 2]
    base = {n: p.detach().clone() for n, p in model.named_parameters() if n in names}
    out = {"bf16": _ppl(model, ids, torch)}
    native = quant.gguf_tensors(find_gguf(), names, cfg.num_attention_heads, cfg.num_key_value_heads)
    embed = "model.embed_tokens.weight"
    vocab = quant.gguf_tensors(find_gguf(), [embed], cfg.num_attention_heads, cfg.num_key_value_heads,
                               keep_q8=True)[embed]
    base[embed] = model.get_input_embeddings().weight.detach().clone()     # the tied matrix (LM head too)
    for label, get in (("q4 (GGUF Q4_1, native)", lambda n: native[n].dequantize() if n in native else None),
                       ("q4 native + Q8_0 vocabulary in 8 bits (bf16 scales), as run",
                        lambda n: native[n].dequantize() if n in native else vocab.dequantize()),
                       ("q4 RTN g32", lambda n: dequantize(quantize_rtn(base[n].numpy(), 32), base[n].shape[1],
                                                             32, True) if n in native else None)):
        with torch.no_grad():
            for n, p in model.named_parameters():
                if n in base:
                    w = get(n)
                    p.copy_(base[n] if w is None else torch.from_numpy(w.astype("float32")))
        out[label] = _ppl(model, ids, torch)
    print("[bench] perplexity of the embedded model on a fixed text (HF, f32, "
          f"{ids.shape[1]} tokens): " + ", ".join(f"{k} {v:.3f}" for k, v in out.items()))
    return out


if __name__ == "__main__":
    bench_q4()
    bench_q4_perplexity()
