"""`make bench`: the printed figures the speed and memory targets are checked against.

1. Generating + stitching all six modules for Llama-3.2-1B (target < 2 s on 2 cores).
2. Embedded model on emu: TTFT for a 30-token prompt, decode tok/s (target >= 15 tok/s), ms/token, with bf16 weights
   and with its GGUF in 4 bits, interleaved in one run (benchmarks/emu_decode.py: medians of --reps runs); then the
   per-token cost of grammar-constrained decoding beside that decode step (benchmarks/constrained.py).
3. Llama-3.2-1B shapes on the null-compute device: dispatches per decode token, host<->device bytes per prefill
   pass and per decode token, host time per decode token (everything except device compute); the device
   buffers of a run and the cold memory check at a 32k context (target < 1 s).
4. `llama-npu serve` with the embedded model on emu: requests/min and TTFT under 4 concurrent clients
   (benchmarks/serve.py, also `make bench-serve`).
5. The NPU2 hardware model's modeled time of the Llama-3.2-1B modules and its calibration error
   (benchmarks/hw_model.py); like-for-like figures, ours and the reference design's modules, modeled NPU + host
   time in three scenarios (likely, optimistic, pessimistic), and the out-of-sample calibration errors
   (benchmarks/hw_scenarios.py); the other families (Qwen2.5, Qwen3, Mistral, Phi-4-mini) at real widths:
   modeled prefill and decode (benchmarks/hw_model.bench_families); the modeled prefill and decode of Gemma-3-1B
   (benchmarks/gemma3.py); Llama-3.2-1B prefill of 2048 / 4096 tokens against issue 25's targets (likely and
   pessimistic) and each prefill GEMM's TFLOPS beside the kernel registry's bf16-out GEMM of the same shape
   (benchmarks/prefill_targets.py).
6. Long context (benchmarks/long_context.py): TTFT of 1k-8k-token prompts and a 10-turn chat on emu; dispatches
   and bytes of long prefills and decode at depth at Llama-3.2-1B shapes on the null device.
7. 4-bit weights (benchmarks/q4.py): device buffers of Llama-3.2-1B / Llama-3.1-8B in q4 with an 8k KV cache,
   the modeled decode token at 1k with the GEMVs priced as gemv_q4, and the embedded model's perplexity on a fixed
   text with bf16 vs q4 weights (HF transformers); the decode token as one module (benchmarks/token_decode.py):
   modeled q4 decode of Llama-3.2-1B / 3.1-8B per-layer vs one dispatch, and the 1B token's per-launch breakdown;
   the 8-bit KV cache (benchmarks/kv8.py): the modeled 1B q4 token at a 32k context with the bf16 vs the KV8
   cache, and the embedded model's perplexity with its K/V through KV8 beside bf16.
8. Block-float weights (benchmarks/bfp16.py, `--weights bfp16`): the modeled Llama-3.2-1B decode token at 1k with
   bf16 vs bfp16 weights (per-layer and one-dispatch, likely and pessimistic), device buffers, and the embedded
   model's perplexity with its layer weights in block float.

`--quick` (`make bench QUICK=1`) runs every section through the same code with small sizes (few tokens, short
prompts, 2 chat turns, 2 serve clients): a smoke test of the benchmarks (tests/test_make_targets.py), not
figures to quote.
"""
from __future__ import annotations

import argparse
import sys
import time


def bench_stitch() -> None:
    from kernel_builder.registry import clear_kernel_cache
    from multi_launch_builder.stitcher import stitch
    from llama_npu.models.llama import LLAMA32_1B, LlamaModel

    clear_kernel_cache()
    t0 = time.perf_counter()
    decls = LlamaModel(LLAMA32_1B).modules((2048,))
    texts = [stitch(d) for d in decls]
    dt = time.perf_counter() - t0
    launches = sum(len(d.launches) for d in decls)
    print(f"[bench] generate+stitch {len(decls)} modules ({launches} launches, "
          f"{sum(map(len, texts)) / 1e3:.0f} kB MLIR) for Llama-3.2-1B @2048: {dt:.3f} s (target < 2 s)")


def bench_embedded(model: str | None, n_tokens: int, reps: int = 5):
    """TTFT and decode of the embedded model on emu, bf16 and its GGUF in 4 bits in one interleaved run
    (benchmarks/emu_decode.py); then its device buffers."""
    from benchmarks.emu_decode import bench_embedded_decode

    eng, ms_per_token = bench_embedded_decode(model, n_tokens, reps)
    mem = eng.cache.memory_report()["cache_allocated_bytes"]
    print(f"[bench] embedded model device buffers, buckets {list(eng.buckets)}: {mem / 2**20:.0f} MiB")
    return eng, ms_per_token


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks")
    ap.add_argument("--model", default=None)
    ap.add_argument("--n-tokens", type=int, default=32)
    ap.add_argument("--reps", type=int, default=5, help="interleaved runs of the emu decode per weight format")
    ap.add_argument("--skip", action="append", default=[],
                    choices=["stitch", "embedded", "constrained", "null1b", "serve", "hw", "long", "q4", "bfp16"])
    ap.add_argument("--quick", action="store_true", help="every section with small sizes (a smoke test, not figures)")
    args = ap.parse_args(argv)
    q = args.quick
    shared = None   # --quick: the long-context sections reuse the embedded section's engine (one model load)
    host = None   # the null device's host time per prefill / token at the reference design's shape
    if "stitch" not in args.skip:
        bench_stitch()
    decode_ms = None
    if "embedded" not in args.skip:
        eng, decode_ms = bench_embedded(args.model, 4 if q else args.n_tokens, 1 if q else args.reps)
        shared = {"engine": eng} if q else None
    if "constrained" not in args.skip:
        from benchmarks.constrained import bench_constrained

        bench_constrained(decode_ms)
    if "null1b" not in args.skip:
        from benchmarks.null_device import bench_cold_plan, bench_load_rss, bench_memory_plan, bench_null_llama32_1b

        bench_null_llama32_1b(n_tokens=2 if q else 8)
        if not q:
            host = bench_null_llama32_1b(n_tokens=4, prompt_len=2000, bucket=2048)  # the reference design's shape
        bench_memory_plan(**({"contexts": (2048,)} if q else {}))
        bench_cold_plan()
        bench_load_rss()
    if "serve" not in args.skip:
        from benchmarks.serve import bench_serve

        bench_serve(**({"n_clients": 2, "per_client": 1, "max_tokens": 4} if q else {}), model=args.model)
    if "hw" not in args.skip:
        from benchmarks.hw_model import bench_families, bench_hw_model

        bench_hw_model(host_times=host, **({"seq": 256} if q else {}))
        from benchmarks.prefill_targets import bench_prefill_targets

        bench_prefill_targets(host["host_s_per_prefill"] if host else None, **({"tokens": (256,)} if q else {}))
        bench_families(**({"seq": 256, "window": 256} if q else {}))
        from benchmarks.gemma3 import bench_gemma3_1b

        bench_gemma3_1b(**({"seq": 256} if q else {}))
    if "q4" not in args.skip:
        from benchmarks.q4 import bench_q4, bench_q4_perplexity

        bench_q4()
        from benchmarks.token_decode import bench_token_decode

        from llama_npu.models.llama import LLAMA32_1B

        bench_token_decode((host or {}).get("greedy_host_ms_per_token"),
                           **({"shapes": (("Llama-3.2-1B", LLAMA32_1B, True),)} if q else {}))
        bench_q4_perplexity()
        from benchmarks.kv8 import bench_kv8_decode, bench_kv8_perplexity

        bench_kv8_decode(**({"window": 1024} if q else {}))
        bench_kv8_perplexity()
    if "bfp16" not in args.skip:
        from benchmarks.bfp16 import bench_bfp16_decode, bench_bfp16_memory, bench_bfp16_perplexity

        bench_bfp16_decode()
        bench_bfp16_memory()
        bench_bfp16_perplexity()
    if "long" not in args.skip:
        from benchmarks.long_context import bench_long_chat, bench_long_prompts, bench_null_long

        bench_long_prompts(args.model, **({"lengths": (100,), **(shared or {})} if q else {}))
        bench_long_chat(args.model, **({"turns": 2, "words_per_turn": 20, **(shared or {})} if q else {}))
        bench_null_long(**({"n_tokens": 1, "lengths": (100,), "depths": (100,), "context": 512} if q else {}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
