"""`make bench`: the linear layers at rest in block float (`--weights bfp16`, kernel_builder/block_float.py).

- Llama-3.2-1B decode per token at a 1k context, bf16 against bfp16 weights (NPU time, likely and pessimistic cost
  scenarios, kernel_builder.hw.scenarios): the per-layer modules (17 dispatches) and the one-dispatch token module
  (llama_npu/models/token.py); the weight bytes a token reads.
- Device buffers of Llama-3.2-1B and Llama-3.1-8B with bf16 and bfp16 weights (llama_npu.memory.plan_memory).
- Quality: perplexity of the embedded model on benchmarks/q4.py's fixed text under HF transformers (f32) with every
  layer weight replaced by its block-float values. Our decode also rounds each GEMV's input vector to block float
  (gemv_bfp's numerics), which this figure does not include; the verify gate (`make verify WEIGHTS=bfp16`) does.
(The prefill figures against issue 25's targets, per weight format: benchmarks/prefill_targets.py.)
"""
from __future__ import annotations

GiB = 1 << 30
WINDOW = 1024


def _token_seconds(shapes, weights: str, params) -> tuple[float, float]:
    """(per-layer modules, one-dispatch token module) modeled seconds of one decode token under `params`."""
    from kernel_builder.hw import analyze_module, cost
    from llama_npu.models.llama import LlamaModel
    from llama_npu.models.token import token_module
    from multi_launch_builder.stitcher import stitch

    m = LlamaModel(shapes, weights)
    layer, head = m.decode(WINDOW).decls[0], m.head().decls[0]

    def seconds(decl) -> float:
        rep = analyze_module(stitch(decl), decl.name)
        return cost.module_seconds([la.work for la in rep.launches], params)
    tok = token_module(m, WINDOW)
    return shapes.n_layers * seconds(layer) + seconds(head), seconds(tok)


def bench_bfp16_decode(shapes=None) -> dict:
    """Prints and returns {(weights, scenario): (per-layer s, token-module s)} for Llama-3.2-1B (or `shapes`)."""
    from benchmarks.hw_model import weight_bytes_per_token
    from kernel_builder.hw.scenarios import scenario_params
    from llama_npu.models.llama import LLAMA32_1B, LlamaModel

    sh = shapes or LLAMA32_1B
    out = {}
    for w in ("bf16", "bfp16"):
        for s in ("likely", "pessimistic"):
            out[w, s] = _token_seconds(sh, w, scenario_params(s))
        gb = weight_bytes_per_token(LlamaModel(sh, w)) / 1e9
        (pl, tk), (pl_p, tk_p) = out[w, "likely"], out[w, "pessimistic"]
        print(f"[bench] modeled decode Llama-3.2-1B, {w} weights, {WINDOW} context (NPU time, likely / pessimistic): "
              f"one module per token {tk * 1e3:.1f} / {tk_p * 1e3:.1f} ms = {1 / tk:.1f} / {1 / tk_p:.1f} tok/s; "
              f"per-layer modules {pl * 1e3:.1f} / {pl_p * 1e3:.1f} ms; {gb:.2f} GB of weights per token")
    return out


def bench_bfp16_memory() -> None:
    from llama_npu.memory import plan_memory
    from llama_npu.models.llama import LLAMA31_8B, LLAMA32_1B

    buckets = (64, 256, 1024, 2048)
    for name, sh, tied in (("Llama-3.2-1B", LLAMA32_1B, True), ("Llama-3.1-8B", LLAMA31_8B, False)):
        figs = []
        for w in ("bf16", "bfp16"):
            p = plan_memory(sh, buckets, 8192, weights=w, tied=tied)
            figs.append(f"{w} weights {p.weights_bytes / GiB:.2f} GiB (total {p.total / GiB:.2f})")
        print(f"[bench] device buffers {name} ({'tied' if tied else 'untied'}, context 8k, LM head bf16): "
              + ", ".join(figs))


def bench_bfp16_perplexity(model_dir=None) -> dict:
    """Perplexity of benchmarks/q4.PPL_TEXT (HF, f32): the embedded model's weights as bf16, and with every layer
    weight rounded to block float (the embedding / tied LM head as they are, as `--weights bfp16` runs)."""
    import torch
    import transformers

    from benchmarks.q4 import PPL_TEXT, _ppl
    from kernel_builder import block_float
    from llama_npu.embedded import ensure_embedded

    path = model_dir or ensure_embedded(progress=False)
    tok = transformers.AutoTokenizer.from_pretrained(path)
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    ids = tok(PPL_TEXT, return_tensors="pt").input_ids
    out = {"bf16": _ppl(model, ids, torch)}
    with torch.no_grad():
        for n, p in model.named_parameters():
            if n.startswith("model.layers.") and p.dim() == 2:
                p.copy_(torch.from_numpy(block_float.quantize(p.detach().numpy())))
    out["bfp16 (layer weights in block float)"] = _ppl(model, ids, torch)
    print(f"[bench] perplexity of the embedded model on a fixed text (HF, f32, {ids.shape[1]} tokens): "
          + ", ".join(f"{k} {v:.3f}" for k, v in out.items()))
    return out


if __name__ == "__main__":
    bench_bfp16_decode()
    bench_bfp16_memory()
    bench_bfp16_perplexity()
