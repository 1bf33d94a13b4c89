"""`make bench`: Llama-3.2-1B prefill against issue 25's targets, and each prefill GEMM's achieved rate beside the
kernel registry's measurement of the same shape.

- Prefill of 2048 and 4096 tokens (chunks of 2048, each chunk's attention at its own position, as the engine runs
  them), modeled NPU time under the likely and pessimistic cost scenarios (kernel_builder.hw.scenarios) + the host
  time the null device measured for a 2048-token prefill (per chunk), beside the targets 0.6 s and 1.4 s.
- Per prefill GEMM launch: its modeled time and achieved TFLOPS (2 x its MACs / time, likely scenario, the ELF
  factor included) beside mlir-air kernel_registry's measured bf16-in / bf16-out GEMM of the same M x K x N
  (details/GEMM_bf16_in_bf16_out.md, high-precision fused-cast, full-chip herd, measured on NPU2: an xclbin of one
  GEMM, so no ELF factor); a gemm_swiglu launch (two GEMMs + the activation) beside twice the registry's GEMM time.
"""
from __future__ import annotations

import re

TARGETS_S = {2048: 0.6, 4096: 1.4}     # issue 25's acceptance (likely scenario, NPU + host)
CHUNK = 2048

# kernel_registry details/GEMM_bf16_in_bf16_out.md, "high-precision, --method fused-cast": GFLOPS incl. the cast
REGISTRY_BF16_OUT_GFLOPS = {
    (2048, 2048, 2048): 6215, (2048, 2048, 512): 4083, (2048, 2048, 8192): 6893, (2048, 8192, 2048): 8898,
    (4096, 2048, 512): 4270, (4096, 2048, 2048): 6675, (4096, 2048, 8192): 6827, (4096, 8192, 2048): 8836,
    (2048, 3072, 3072): 7513, (2048, 3072, 8192): 7601, (2048, 8192, 3072): 9092,
}


def _reports(decls, pos: int | None = None) -> dict:
    from kernel_builder.hw import analyze_module
    from multi_launch_builder.stitcher import stitch

    out = {}
    for d in decls:
        text = stitch(d)
        if pos is not None:
            text = re.sub(r"llama_npu\.range = \[\d+, \d+\]", f"llama_npu.range = [{pos}, {pos}]", text)
        out[d.name] = analyze_module(text, d.name)
    return out


def prefill_seconds(model, tokens: int, params) -> float:
    """Modeled NPU seconds of a `tokens`-token prefill in chunks of CHUNK (n_layers x each chunk's modules at its
    position + the LM head once) under `params`."""
    from kernel_builder.hw import cost

    windows = model.kv_windows(tokens)
    total = 0.0
    for pos in range(0, tokens, CHUNK):
        rows = min(CHUNK, tokens - pos)
        window = min(w for w in (rows, *windows) if w >= pos + rows)
        reps = _reports(model.prefill(rows, window).decls, pos)
        total += model.shapes.n_layers * sum(cost.module_seconds([la.work for la in r.launches], params)
                                             for r in reps.values())
    (head,) = model.head().decls
    rep = _reports([head])[head.name]
    return total + cost.module_seconds([la.work for la in rep.launches], params)


def bench_prefill_targets(host_s_per_chunk: float | None = None, tokens=(2048, 4096)) -> dict:
    """Print the 1B prefill figures (likely, pessimistic) against the targets; return {tokens: {scenario: s}}."""
    from kernel_builder.hw.scenarios import scenario_params
    from llama_npu.models.llama import LLAMA32_1B, LlamaModel

    m = LlamaModel(LLAMA32_1B)
    host = host_s_per_chunk or 0.0
    src = "host time measured on the null device" if host_s_per_chunk else "no host time measured (--skip null1b)"
    out = {}
    print(f"[bench] Llama-3.2-1B prefill vs issue 25's targets (modeled NPU + host per {CHUNK}-token chunk, {src}):")
    for n in tokens:
        chunks = -(-n // CHUNK)
        out[n] = {s: prefill_seconds(m, n, scenario_params(s)) + chunks * host for s in ("likely", "pessimistic")}
        target = TARGETS_S.get(n)
        print(f"[bench]   {n} tokens: {out[n]['likely']:.2f} s likely, {out[n]['pessimistic']:.2f} s pessimistic"
              + (f" (target {target} s likely)" if target else ""))
    _gemm_rates(m, tokens[0])
    return out


def _gemm_rates(m, rows: int) -> None:
    from multi_launch_builder.stitcher import stitch

    decls = m.prefill(rows).decls
    reps = _reports(decls)
    from benchmarks.hw_model import best_bfp16_gemm

    print(f"[bench]   prefill GEMMs at {rows} rows (modeled, likely, ELF factor included; kernel_registry GEMM "
          f"bf16-in/bf16-out measured on NPU2 for the same shape; {best_bfp16_gemm()}):")
    for d in decls:
        r = reps[d.name]
        attrs = _kernel_attrs(stitch(d))
        for la, (kind, params) in zip(r.launches, attrs):
            if not kind.startswith("gemm"):
                continue
            shape = (params["m"], params["k"], params["n"])
            tflops = 2 * la.work.vector_macs / (la.modeled_ms * 1e-3) / 1e12
            reg = REGISTRY_BF16_OUT_GFLOPS.get(shape)
            if reg and kind == "gemm_swiglu":
                beside = f"registry 2 x {shape[0]}x{shape[1]}x{shape[2]}: {reg / 1e3:.2f} TFLOPS"
            elif reg:
                beside = f"registry {reg / 1e3:.2f} TFLOPS"
            else:
                beside = "no registry figure for this shape"
            print(f"[bench]     {la.name.split('@')[-1].removesuffix('_seg'):14s} {kind:11s} "
                  f"{shape[0]}x{shape[1]}x{shape[2]}: {la.modeled_ms:6.2f} ms, {tflops:5.2f} TFLOPS ({beside})")


def _kernel_attrs(text: str) -> list[tuple[str, dict]]:
    """(kind, integer params) of every launch's llama_npu.kernel attribute, in launch order."""
    out = []
    for kind, body in re.findall(r'llama_npu\.kernel = \{kind = "(\w+)"([^}]*)\}', text):
        out.append((kind, {k: int(v) for k, v in re.findall(r"(\w+) = (-?\d+)(?![.\d])", body)}))
    return out
