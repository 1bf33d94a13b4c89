"""`make bench`: like-for-like speed figures for Llama-3.2-1B under the cost model's three scenarios (likely first,
then optimistic and pessimistic; kernel_builder/hw/scenarios.py): a 2048-token prefill and a decode token at a
1k context, for OUR modules and, under the same model, for the REFERENCE design's modules
(benchmarks/hw_calibration.reference_points), each as modeled NPU time + host time. Our host time is measured
on the null device (benchmarks/null_device.py: everything but device compute); the reference's is the host part
of its own published profile. The reference's measured wall times are printed beside them, labelled as
measurements. Then the calibration's out-of-sample errors (kernel_builder/hw/calibration.py): fitted on the
kernel registry's single kernels, the reference's modules predicted without refitting, and the reverse.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from kernel_builder.hw import cost
from kernel_builder.hw.scenarios import SCENARIOS, all_scenarios

PREFILL_ROWS = 2048
DECODE_CONTEXT = 1024

# The reference design's published figures (mlir-air programming_examples/llms/llama32_1b/docs/profile.md).
REF_SRC = "mlir-air llama32_1b docs/profile.md"
REFERENCE_PREFILL_WALL_S = 1.27        # "Wall time: 1.27s", 2048-token prefill
REFERENCE_PREFILL_NPU_S = 1.062        # "NPU Run" sum of the 49 XRT calls
REFERENCE_PREFILL_HOST_S = 0.037 + 0.125 + 0.046 + 0.005   # CPU host ops + Python scheduling + BO write + BO read
REFERENCE_DECODE_WALL_S = 92e-3        # "Decode Breakdown (per token): 92ms"
REFERENCE_DECODE_NPU_S = 58e-3 + 14e-3 + 14e-3   # o_gemv_ffn + rms_gemv_rope + lm_head_gemv
REFERENCE_DECODE_HOST_S = 5e-3         # "CPU (attention + RMSNorm + host) 5ms" (its decode attention runs on the CPU)


@dataclass(frozen=True)
class Figure:
    """One workload under the three scenarios: modeled NPU seconds per scenario + host seconds."""
    what: str
    npu: dict
    host_s: float
    host_src: str

    def total(self, scenario: str) -> float:
        return self.npu[scenario] + self.host_s

    def line(self) -> str:
        tot = {s: self.total(s) for s in SCENARIOS}
        return (f"{self.what}: {_s(tot['likely'])} likely ({_s(tot['optimistic'])} optimistic, "
                f"{_s(tot['pessimistic'])} pessimistic) = modeled NPU {_s(self.npu['likely'])} "
                f"({_s(self.npu['optimistic'])}-{_s(self.npu['pessimistic'])}) + host {_s(self.host_s)} "
                f"({self.host_src})")


def _module_s(reports: dict, names, params) -> float:
    return sum(cost.module_seconds([la.work for la in reports[n].launches], params) for n in names)


def our_figures(host: dict) -> tuple[Figure, Figure]:
    """(prefill 2048, decode at a 1k context) of our Llama-3.2-1B modules. `host`: the null-device result
    (host_s_per_prefill, host_ms_per_decode_token, prompt_len)."""
    from kernel_builder.hw import analyze_module
    from multi_launch_builder.stitcher import stitch
    from llama_npu.models.llama import LLAMA32_1B as sh
    from llama_npu.models.llama import LlamaModel

    m = LlamaModel(sh)
    pre = m.prefill(PREFILL_ROWS).decls
    (head,) = m.head().decls
    window = min(w for w in m.kv_windows(8 * DECODE_CONTEXT) if w > DECODE_CONTEXT)
    dec = m.decode(window).decls
    reports = {d.name: analyze_module(stitch(d), d.name) for d in pre + [head]}
    for d in dec:   # the attention costed at the context's position, not at the window's worst case
        text = re.sub(r"llama_npu\.range = \[\d+, \d+\]",
                      f"llama_npu.range = [{DECODE_CONTEXT}, {DECODE_CONTEXT}]", stitch(d))
        reports[d.name] = analyze_module(text, d.name)
    sc = all_scenarios()
    n = sh.n_layers
    prefill = {s: n * _module_s(reports, [d.name for d in pre], p) + _module_s(reports, [head.name], p)
               for s, p in sc.items()}
    decode = {s: n * _module_s(reports, [d.name for d in dec], p) + _module_s(reports, [head.name], p)
              for s, p in sc.items()}
    src = f"measured on the null device, {host['prompt_len']}-token prompt"
    return (Figure(f"ours, prefill {PREFILL_ROWS} tokens ({n} x {' + '.join(d.name for d in pre)} + {head.name})",
                   prefill, host["host_s_per_prefill"], src),
            Figure(f"ours, decode token at a {DECODE_CONTEXT}-token context ({n} x {dec[0].name} + {head.name})",
                   decode, host["host_ms_per_decode_token"] / 1e3, "measured on the null device"))


def reference_figures() -> tuple[Figure, Figure]:
    """The reference design's modules (benchmarks/hw_calibration.reference_points) under the same model:
    prefill = 16 x (rms_gemms_rope + flash_attn + o_ffn) + the LM-head GEMV; decode = 16 x (rms_gemv_rope +
    o_gemv_ffn) + the LM-head GEMV (its decode attention runs on the CPU: host time)."""
    from benchmarks.hw_calibration import reference_points

    pts = {p.name.split(" ")[0]: p for p in reference_points()}
    sc = all_scenarios()

    def s(names, params):
        return sum(cost.module_seconds(pts[k].works, params, pts[k].vectorized_matmul, pts[k].elf) for k in names)

    prefill = {k: 16 * s(("rms_gemms_rope", "flash_attn", "o_ffn"), p) + s(("lm_head",), p) for k, p in sc.items()}
    decode = {k: 16 * s(("rms_gemv_rope", "o_gemv_ffn"), p) + s(("lm_head",), p) for k, p in sc.items()}
    return (Figure(f"reference design, prefill {PREFILL_ROWS} tokens (its modules, same model)", prefill,
                   REFERENCE_PREFILL_HOST_S, f"{REF_SRC}: CPU ops + Python + buffer writes/reads"),
            Figure("reference design, decode token (its modules, same model)", decode, REFERENCE_DECODE_HOST_S,
                   f"{REF_SRC}: CPU attention + RMSNorm + host"))


def bench_scenarios(host: dict | None = None) -> dict:
    """Print the like-for-like figures and the out-of-sample calibration errors; return the figures."""
    from benchmarks.hw_calibration import reference_points, registry_points
    from kernel_builder.hw.calibration import both_ways

    if host is None:
        from benchmarks.null_device import bench_null_llama32_1b
        host = bench_null_llama32_1b(n_tokens=4, prompt_len=2000, bucket=2048)
    ours_p, ours_d = our_figures(host)
    ref_p, ref_d = reference_figures()
    print("[bench] like for like, Llama-3.2-1B: modeled NPU time + host time, cost-model scenarios likely "
          "(optimistic, pessimistic) - docs/hardware-model.md:")
    print(f"[bench]   {ours_p.line()}")
    print(f"[bench]   {ref_p.line()}")
    print(f"[bench]     reference design MEASURED on Strix ({REF_SRC}): wall time {_s(REFERENCE_PREFILL_WALL_S)} "
          f"(NPU runs {_s(REFERENCE_PREFILL_NPU_S)})")
    print(f"[bench]   {ours_d.line()}")
    print(f"[bench]   {ref_d.line()}")
    print(f"[bench]     reference design MEASURED on Strix ({REF_SRC}): {_s(REFERENCE_DECODE_WALL_S)} per token "
          f"(NPU runs {_s(REFERENCE_DECODE_NPU_S)})")
    for k in SCENARIOS:
        print(f"[bench]   {k:11s} ours / reference (both modeled): prefill "
              f"{ours_p.total(k) / ref_p.total(k):.2f}x, decode {ours_d.total(k) / ref_d.total(k):.2f}x the time")
    counted_vs_registry()
    v1, v2 = both_ways(registry_points(), reference_points(), "the kernel registry's single kernels",
                       "the reference design's modules")
    print("[bench] calibration out of sample (FITTED: " + ", ".join(cost.FITTED) + "):")
    print(f"[bench]   {v1.line()}")
    print(f"[bench]   {v2.line()}")
    return {"ours_prefill": ours_p, "ours_decode": ours_d, "ref_prefill": ref_p, "ref_decode": ref_d,
            "validation": (v1, v2)}


REGISTRY_GEMM_GFLOPS = {(2048, 2048, 2048): 8508, (2048, 2048, 8192): 8278, (2048, 8192, 2048): 9797,
                        (2048, 2048, 512): 7342}   # kernel_registry details/GEMM_bf16_in_fp32_out.md


def peak_gflops(params=cost.PARAMS) -> float:
    """The array's block-float mmul peak (the registry's GEMMs run bf16 through the block-float mmul, aie_api's
    emulation flag): 32 cores x 512 MACs per bfp16_mmul_cycles x 2 x clock_hz."""
    import math

    from kernel_builder.hw.facts import NPU2

    macs = math.prod(NPU2.bfp16_mmul_shape)
    return NPU2.core_tiles * 2 * macs / params.bfp16_mmul_cycles * params.clock_hz / 1e9


def counted_vs_registry() -> None:
    """What the fitted efficiency knobs used to be, now outputs of the counted model: the modeled rate of the
    registry's GEMMs and time of its vector kernels (their designs' calls counted as our kernels'), likely
    (optimistic-pessimistic), beside the registry's measurements."""
    from benchmarks.hw_calibration import gemm, registry_points

    sc = all_scenarios()
    peak = peak_gflops(sc["likely"])
    print("[bench] counted compute vs the kernel registry's measurements (outputs, nothing fitted; "
          "docs/hardware-model.md, \"Counted compute\"):")
    for (m, k, n), meas in REGISTRY_GEMM_GFLOPS.items():
        g = {s: 2 * m * k * n / cost.module_seconds([gemm(m, k, n, 64, 128, out_bytes=4)], p, True, elf=False) / 1e9
             for s, p in sc.items()}
        print(f"[bench]   GEMM {m}x{k}x{n} f32 out: modeled {g['likely']:.0f} GFLOPS ({g['pessimistic']:.0f}-"
              f"{g['optimistic']:.0f}) = {g['likely'] / peak * 100:.0f}% of the {peak / 1e3:.1f} TFLOPS "
              f"block-float mmul peak (likely); registry measured {meas} GFLOPS ({meas / peak * 100:.0f}%)")
    for pt in registry_points():
        if not any(w in pt.name for w in ("SiLU", "RMSNorm", "add", "RoPE 65536", "FlashAttention")):
            continue
        t = {s: cost.module_seconds(pt.works, p, pt.vectorized_matmul, pt.elf) for s, p in sc.items()}
        print(f"[bench]   {pt.name}: modeled {_s(t['likely'])} ({_s(t['optimistic'])}-{_s(t['pessimistic'])}); "
              f"registry measured {_s(pt.measured_s)}")


def _s(seconds: float) -> str:
    return f"{seconds:.2f} s" if seconds >= 1 else f"{seconds * 1e3:.1f} ms"
