"""`make bench`: modeled NPU2 time of today's modules for Llama-3.2-1B (kernel_builder.hw cost model, likely
scenario; the like-for-like comparison with the reference design - modeled NPU + host, three scenarios - is
benchmarks/hw_scenarios.py, printed at the end): the decode token as
the fused layer module `layer_kv<window>` per layer (KV windows 256 / 2048 / 8192) + the LM head, with the
bandwidth floor (weight bytes per token over the cost model's DDR ceiling and over 60 GB/s), every kernel's
(launch's) modeled time and scalar MAC share in the prefill, LM-head and decode modules, and the cost model's
calibration error per calibration point (docs/hardware-model.md)."""
from __future__ import annotations

import math
import time

REFERENCE_PREFILL_S = 1.27     # 2048-token prefill TTFT, reference design on Strix (guide A3)
REFERENCE_DECODE_S = 92e-3     # per decode token (guide A3)


DECODE_WINDOWS = (256, 2048, 8192)   # KV windows of the fused decode layer (short, default bucket, long context)
FLOOR_BYTES_PER_S = 60e9             # what an NPU2 reaches on DDR (issue 13: the 41 ms floor at 2.47 GB)


def weight_bytes_per_token(model) -> int:
    """Bytes of weights one decode token reads: every layer's tensors, the final norm and the LM head (bf16,
    each read once; the LM head's zero-padded partition tail not counted)."""
    s = model.shapes
    layer = sum(math.prod(shape) for _, shape in model.layer_tensors().values())
    return 2 * (s.n_layers * layer + s.hidden + s.vocab * s.hidden)


def bench_hw_model(seq: int = 2048, host_times: dict | None = None, scenarios: bool = True) -> None:
    """`host_times`: benchmarks.null_device.bench_null_llama32_1b's result at the 2048 bucket (measured when
    None); `scenarios=False` skips the like-for-like section (benchmarks/hw_scenarios.py)."""
    from kernel_builder.hw import analyze_module, cost
    from benchmarks.hw_calibration import all_points
    from multi_launch_builder.stitcher import stitch
    from llama_npu.models.llama import LLAMA32_1B as sh
    from llama_npu.models.llama import LlamaModel

    t0 = time.perf_counter()
    m = LlamaModel(sh)
    reps = {}
    host = m.decode().decls   # the host-attention fallback (--decode-attention host): qkv_dec + ffn_dec
    decls = m.prefill(seq).decls + m.head().decls + [d for w in DECODE_WINDOWS for d in m.decode(w).decls] + host
    for d in decls:
        reps[d.name] = analyze_module(stitch(d), d.name)
    dt = time.perf_counter() - t0
    pre = [d.name for d in m.prefill(seq).decls]
    head = m.head().decls[0].name
    prefill = sh.n_layers * sum(reps[n].modeled_s for n in pre) + reps[head].modeled_s
    decode = {w: sh.n_layers * sum(reps[d.name].modeled_s for d in m.decode(w).decls) + reps[head].modeled_s
              for w in DECODE_WINDOWS}
    over = sum(not r.ok for r in reps.values())
    print(f"[bench] NPU2 cost model, Llama-3.2-1B, today's modules ({over} of {len(reps)} over an NPU2 limit; "
          f"analyzed in {dt:.2f} s):")
    print(f"[bench]   modeled prefill ({seq} tokens): {_s(prefill)} NPU time, likely scenario (no host time: "
          f"like-for-like figures below)")
    two_s, two = _chunked_prefill(m, 2 * seq, seq, reps[head].modeled_s)
    print(f"[bench]   modeled prefill ({2 * seq} tokens, {len(two)} chunks of {seq}): {_s(two_s)}  "
          f"({', '.join(f'pos {p} window {w}' for p, w in two)})")
    long_s, chunks = _chunked_prefill(m, 4 * seq, seq, reps[head].modeled_s)
    print(f"[bench]   modeled prefill ({4 * seq} tokens, {len(chunks)} chunks of {seq} over the KV window): "
          f"{_s(long_s)}  ({', '.join(f'pos {p} window {w}' for p, w in chunks)})")
    per = ", ".join(f"window {w}: {_s(decode[w])}" for w in DECODE_WINDOWS)
    print(f"[bench]   modeled decode per token ({sh.n_layers} x layer_kv<window> + {head}, "
          f"{sh.n_layers + 1} dispatches): {per}")
    fallback = sh.n_layers * sum(reps[d.name].modeled_s for d in host) + reps[head].modeled_s
    print(f"[bench]   fallback, host attention (--decode-attention host: {sh.n_layers} x "
          f"{' + '.join(d.name for d in host)} + {head}): {_s(fallback)} per token + the host's attention")
    wb = weight_bytes_per_token(m)
    ddr = cost.PARAMS.ddr_bytes_per_s
    print(f"[bench]   bandwidth floor: {wb / 1e9:.2f} GB of weights per token / {ddr / 1e9:.1f} GB/s (the cost "
          f"model's DDR ceiling) = {_s(wb / ddr)}; / {FLOOR_BYTES_PER_S / 1e9:.0f} GB/s = "
          f"{_s(wb / FLOOR_BYTES_PER_S)}")
    names = pre + [head] + [d.name for w in DECODE_WINDOWS for d in m.decode(w).decls] + [d.name for d in host]
    print("[bench]   per module: " + ", ".join(f"{n} {_s(reps[n].modeled_s)}" for n in names))
    for n in pre + [head, m.decode(DECODE_WINDOWS[0]).decls[0].name]:
        print(f"[bench]   kernels of {n} (launch: modeled ms, scalar MAC share): " + ", ".join(
            f"{la.name.split(' ')[0]} {la.modeled_ms:.3f} {la.work.scalar_share * 100:.0f}%"
            for la in reps[n].launches))
    _print_tflops(reps, pre)
    _print_attention(m, seq)
    errs = cost.errors(all_points())
    print(f"[bench] cost model calibration ({len(errs)} published/measured points, |error| mean "
          f"{sum(abs(e) for *_, e in errs) / len(errs) * 100:.0f}%, max {max(abs(e) for *_, e in errs) * 100:.0f}%):")
    for name, modeled, measured, e in errs:
        print(f"[bench]   {name:44s} modeled {modeled * 1e3:8.2f} ms  measured {measured * 1e3:8.2f} ms  "
              f"{e * 100:+5.0f}%")
    if scenarios:
        from benchmarks.hw_scenarios import bench_scenarios
        bench_scenarios(host_times)


def bench_families(seq: int = 2048, window: int = 2048) -> None:
    """Modeled NPU time (cost model, likely scenario) of the other families at real models' widths
    (llama_npu.models.FAMILY_SHAPES): a `seq`-token prefill (n_layers x the prefill modules + the LM head) and a
    decode token (n_layers x layer_kv<window> + the LM head), with the weights a token reads."""
    from kernel_builder.hw import analyze_module
    from llama_npu.models import FAMILY_SHAPES, family_model
    from multi_launch_builder.stitcher import stitch

    print(f"[bench] NPU2 cost model, other families at real widths (prefill {seq} tokens; decode per token at "
          f"KV window {window}; likely scenario, NPU time only):")
    for name, (arch, sh) in FAMILY_SHAPES.items():
        m = family_model(name)
        t = {d.name: analyze_module(stitch(d), d.name) for d in
             m.prefill(seq).decls + m.head().decls + m.decode(window).decls}
        head = t["lm_head"].modeled_s
        prefill = sh.n_layers * sum(t[d.name].modeled_s for d in m.prefill(seq).decls) + head
        decode = sh.n_layers * sum(t[d.name].modeled_s for d in m.decode(window).decls) + head
        over = sum(not r.ok for r in t.values())
        print(f"[bench]   {name:13s} ({arch}, {sh.n_layers} layers, hidden {sh.hidden}): prefill {_s(prefill)}, "
              f"decode {_s(decode)} per token ({weight_bytes_per_token(m) / 1e9:.2f} GB of weights per token; "
              f"{over} of {len(t)} modules over an NPU2 limit)")


# mlir-air kernel_registry details/GEMM_bf16_in_fp32_out.md (8x4 herd, external path): measured GFLOPS by shape;
# the reference design's flash attention (llama32_1b docs/profile.md): 21.6 ms per layer at 2048 rows
REGISTRY_GEMM_GFLOPS = {(2048, 2048, 2048): 8508, (2048, 2048, 8192): 8278, (2048, 8192, 2048): 9797,
                        (2048, 2048, 512): 7342}
REFERENCE_FLASH_ATTN_S = 21.6e-3


def _print_tflops(reps: dict, names) -> None:
    """Achieved TFLOPS (2 x the MACs the launch's kernels issue / its modeled time) of each GEMM and attention
    launch of the prefill, beside the registry's measured GEMM figures and the reference's flash attention."""
    import re

    from llama_npu.models.llama import LLAMA32_1B as sh

    rows = []
    for n in names:
        for la in reps[n].launches:
            kind = la.name.split(" ")[0]
            if kind in ("gemm", "attention") and la.modeled_ms > 0:
                rows.append(f"{la.name.split('@')[-1].removesuffix('_seg')} "
                            f"{2 * la.work.vector_macs / (la.modeled_ms * 1e-3) / 1e12:.2f}")
    print("[bench]   achieved TFLOPS per prefill launch (modeled, likely; 2 x issued MACs / time): " + ", ".join(rows))
    reg = ", ".join(f"{m}x{k}x{n} {g / 1e3:.2f}" for (m, k, n), g in REGISTRY_GEMM_GFLOPS.items())
    seq = int(re.search(r"(\d+)$", names[0]).group(1)) if re.search(r"(\d+)$", names[0]) else 2048
    flops = 4 * sh.n_heads * sh.head_dim * seq * (seq + 1) / 2   # causal q.k^T + p.v
    print(f"[bench]   beside: registry GEMM TFLOPS measured (kernel_registry GEMM_bf16_in_fp32_out): {reg}; "
          f"reference flash attention {seq} rows: {flops / REFERENCE_FLASH_ATTN_S / 1e12:.2f} TFLOPS (causal "
          f"flops / its measured {REFERENCE_FLASH_ATTN_S * 1e3:.1f} ms); {best_bfp16_gemm()}")


def best_bfp16_gemm() -> str:
    """The best measured block-float GEMM on NPU2 (facts.py bfp16_gemm_tflops_measured), for the TFLOPS lines."""
    from kernel_builder.hw.facts import NPU2

    config, strix, krackan = max(NPU2.bfp16_gemm_tflops_measured, key=lambda r: r[1])
    return (f"best measured block-float GEMM: {strix} TFLOPS on Strix, {krackan} on Krackan (mlir-aie "
            f"gemm_asymmetric_tile_buffering config {config}, 32 cores)")


def _print_attention(m, seq: int) -> None:
    """The prefill attention launch per layer at `seq` and 2 x `seq` tokens (chunks of `seq`, each costed at its own
    position), likely and pessimistic scenarios: modeled ms, achieved TFLOPS (causal useful flops / time, and the
    block-float MACs the busiest tile issues x tiles / time) and the plan's causal balance (busiest core / mean)."""
    import re

    from kernel_builder.attention.plan import plan_attention
    from kernel_builder.hw import analyze_module, cost
    from kernel_builder.hw.scenarios import all_scenarios
    from multi_launch_builder.stitcher import stitch

    sh, sc = m.shapes, all_scenarios()
    for total in (seq, 2 * seq):
        windows = m.kv_windows(total)
        t, issued, bal = {s: 0.0 for s in sc}, 0, []
        for pos in range(0, total, seq):
            win = _window(seq, pos, windows)
            (d,) = [d for d in m.prefill(seq, win).decls if "llama_npu.range" in stitch(d)]
            text = re.sub(r"llama_npu\.range = \[\d+, \d+\]", f"llama_npu.range = [{pos}, {pos}]", stitch(d))
            la = next(la for la in analyze_module(text, d.name).launches if la.name.startswith("attention"))
            for s, p in sc.items():
                t[s] += cost.module_seconds([la.work], p)
            plan = plan_attention(seq, win, sh.n_heads, sh.n_kv_heads, sh.head_dim)
            issued += 2 * la.work.tile_mmul_macs * plan.cores
            bal.append(f"{plan.balance():.3f}")
        useful = 4 * sh.n_heads * sh.head_dim * total * (total + 1) / 2
        print(f"[bench]   attention, prefill {total} tokens: {t['likely'] * 1e3:.2f} ms/layer likely "
              f"({t['pessimistic'] * 1e3:.2f} pessimistic); achieved {useful / t['likely'] / 1e12:.2f} TFLOPS causal "
              f"({issued / t['likely'] / 1e12:.2f} issued by the block-float mmuls); busiest core / mean "
              f"{', '.join(bal)} (attention plan, per chunk)")


def _chunked_prefill(m, total: int, rows: int, head_s: float) -> tuple[float, list[tuple[int, int]]]:
    """Modeled prefill of `total` tokens in chunks of `rows`, the window of each the smallest KV window holding
    it (as the engine picks it); see modeled_chunks."""
    chunks = [(pos, rows) for pos in range(0, total, rows)]
    windows = m.kv_windows(total)
    seconds = head_s + modeled_chunks(m, chunks, windows)
    return seconds, [(p, _window(r, p, windows)) for p, r in chunks]


def _window(rows: int, pos: int, windows) -> int:
    return min(w for w in (rows, *windows) if w >= pos + rows)


_STATIC_S: dict = {}


def modeled_chunks(m, chunks, windows) -> float:
    """Modeled NPU time of prefill chunks [(position, rows)] (model.prefill(rows, window) per chunk, n_layers
    times). Each chunk's attention is costed at the chunk's own position (its llama_npu.range pinned to it):
    the module's own figure is its window's worst case, the last chunk it can hold. Modules without a ranged
    operand are analysed once per shape."""
    import re

    from kernel_builder.hw import analyze_module
    from multi_launch_builder.stitcher import stitch

    seconds = 0.0
    for pos, rows in chunks:
        for d in m.prefill(rows, _window(rows, pos, windows)).decls:
            text = stitch(d)
            if "llama_npu.range" in text:
                text = re.sub(r"llama_npu\.range = \[\d+, \d+\]", f"llama_npu.range = [{pos}, {pos}]", text)
                s = analyze_module(text, d.name).modeled_s
            else:
                key = (id(m.shapes), d.name)
                if key not in _STATIC_S:
                    _STATIC_S[key] = analyze_module(text, d.name).modeled_s
                s = _STATIC_S[key]
            seconds += m.shapes.n_layers * s
    return seconds


def _s(seconds: float) -> str:
    if seconds >= 3600:
        return f"{seconds / 3600:.1f} h"
    if seconds >= 60:
        return f"{seconds / 60:.1f} min"
    if seconds >= 1:
        return f"{seconds:.2f} s"
    return f"{seconds * 1e3:.1f} ms"
