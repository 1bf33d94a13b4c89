"""`make bench`: modeled NPU2 time of Gemma-3-1B's modules (kernel_builder.hw cost model, likely scenario):
a 2048-token prefill chunk and a decode token over KV windows 256 / 2048 / 8192, each the sum over the 26 layers
of its variant's modules (22 sliding-window layers: `_local` modules, window 512; 4 global layers) plus the LM
head (vocabulary 262,144), and the bandwidth floor (weight bytes per token over the cost model's DDR ceiling).
llama_npu/models/gemma3.py describes the family; docs/families.md how it maps onto the graph."""
from __future__ import annotations

import time

DECODE_WINDOWS = (256, 2048, 8192)


def bench_gemma3_1b(seq: int = 2048) -> dict:
    from kernel_builder.hw import analyze_module, cost
    from multi_launch_builder.stitcher import stitch
    from llama_npu.models.gemma3 import GEMMA3_1B, GEMMA3_1B_OPTIONS, Gemma3Model

    from benchmarks.hw_model import _s, weight_bytes_per_token

    t0 = time.perf_counter()
    o = GEMMA3_1B_OPTIONS
    m = Gemma3Model(GEMMA3_1B, o["layer_types"], o["window"], o["scale_dim"], o["softcap"])
    reps: dict = {}

    def seconds(decls) -> float:
        for d in decls:
            if d.name not in reps:
                reps[d.name] = analyze_module(stitch(d), d.name)
        return sum(reps[d.name].modeled_s for d in decls)

    count = {v: m.layer_types.count(v) for v in m.layer_variants}
    head = seconds(m.head().decls)
    prefill = head + sum(n * seconds(m.prefill(seq, seq, v).decls) for v, n in count.items())
    decode = {w: head + sum(n * seconds(m.decode(w, v).decls) for v, n in count.items()) for w in DECODE_WINDOWS}
    over = sum(not r.ok for r in reps.values())
    wb = weight_bytes_per_token(m)
    print(f"[bench] NPU2 cost model, Gemma-3-1B ({count.get('local', 0)} sliding-window layers (window "
          f"{m.sliding_window}) + {count.get('', 0)} global, head_dim 256, vocabulary {m.shapes.vocab}; "
          f"{over} of {len(reps)} modules over an NPU2 limit; analyzed in {time.perf_counter() - t0:.2f} s):")
    print(f"[bench]   modeled prefill ({seq} tokens): {_s(prefill)} NPU time, likely scenario")
    print("[bench]   modeled decode per token (26 x layer_kv<window> or, local layers past their window, "
          "layer_slide<span>_local + lm_head): "
          + ", ".join(f"window {w}: {_s(decode[w])}" for w in DECODE_WINDOWS))
    print(f"[bench]   bandwidth floor: {wb / 1e9:.2f} GB of weights per token / "
          f"{cost.PARAMS.ddr_bytes_per_s / 1e9:.1f} GB/s = {_s(wb / cost.PARAMS.ddr_bytes_per_s)}")
    return {"prefill_s": prefill, "decode_s": decode, "over": over}


if __name__ == "__main__":
    bench_gemma3_1b()
