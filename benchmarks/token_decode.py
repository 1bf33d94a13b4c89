"""`make bench`: the decode token as one module (llama_npu/models/token.py) against the per-layer decode, modeled
with the counted cost model (kernel_builder.hw, likely scenario): Llama-3.2-1B and Llama-3.1-8B shapes with q4
weights (group 32, mins) at a 1k context, dispatches per token, NPU time and, when the null-device host time per
greedy token is given, NPU + host; then the per-launch breakdown of the 1B q4 token (launches grouped by what
they compute, summed over the layers), biggest first."""
from __future__ import annotations

from collections import defaultdict

WINDOW = 1024


def _reports(shapes, weights: str, window: int = WINDOW, tied: bool = True):
    """(per-layer decode: [(report, times)], the token module's report) from the stitched module texts."""
    from kernel_builder.hw import analyze_module
    from llama_npu.models.llama import LlamaModel
    from llama_npu.models.token import token_module
    from multi_launch_builder.stitcher import stitch

    m = LlamaModel(shapes, weights)
    m.tied = tied     # a tied model gathers its embedding row from the LM head's rows (q4: one dequant launch)
    layer, head = m.decode(window).decls[0], m.head().decls[0]
    per_layer = [(analyze_module(stitch(layer), layer.name), shapes.n_layers), (analyze_module(stitch(head)), 1)]
    tok = token_module(m, window)
    return per_layer, analyze_module(stitch(tok), tok.name)


def _group(name: str) -> str:
    """A launch name `<kind> @<prefix>_<kernel>_seg` (prefix `l<L>_<op>`, `head_<op>`, `top<p>`) -> the op it
    computes, layer and partition dropped: `gate (gemv_q4)`, `LM head (gemv_q4)`, `topk`."""
    kind, _, seg = name.partition(" @")
    for suffix in ("_herd_segment", "_seg"):
        seg = seg.removesuffix(suffix)
    rest = seg.rsplit("_", 1)[0]
    if rest.startswith("top"):
        return "topk (argmax chain)"
    if rest.startswith("head_logits"):
        return f"LM head ({kind})"
    if rest.startswith("head_"):
        return f"final norm ({kind})"
    op = rest.split("_", 1)[1] if rest[:1] == "l" and "_" in rest else rest
    return f"{op} ({kind})"


def breakdown(rep) -> list[tuple[str, float, int, str]]:
    """(group, modeled ms summed, launches, bound) per group of the report's launches, biggest first."""
    from kernel_builder.hw import cost

    ms, n, bound = defaultdict(float), defaultdict(int), {}
    for la in rep.launches:
        g = _group(la.name)
        c = cost.launch_cost(la.work, rep.params)
        ms[g] += c.total_s * 1e3
        n[g] += 1
        bound[g] = c.bound
    return sorted(((g, ms[g], n[g], bound[g]) for g in ms), key=lambda r: -r[1])


def bench_token_decode(host_ms_per_token: float | None = None, shapes=None) -> dict:
    """Prints and returns {model: (per-layer s, token-module s)} (NPU time, likely). `shapes`: (name, shapes, tied)
    rows (default Llama-3.2-1B tied, Llama-3.1-8B untied)."""
    from kernel_builder.hw import cost
    from llama_npu.models.llama import LLAMA31_8B, LLAMA32_1B

    out = {}
    for name, sh, tied in shapes or (("Llama-3.2-1B", LLAMA32_1B, True), ("Llama-3.1-8B", LLAMA31_8B, False)):
        per_layer, tok = _reports(sh, "q4", tied=tied)
        before = sum(r.modeled_s * t for r, t in per_layer)
        after = tok.modeled_s
        out[name] = (before, after)
        host = "" if host_ms_per_token is None else (
            f"; NPU + host ({host_ms_per_token:.2f} ms/token on the null device): "
            f"{1 / (after + host_ms_per_token / 1e3):.1f} tok/s")
        print(f"[bench] modeled q4 decode {name} at a {WINDOW} context (likely, NPU time): per-layer "
              f"{sh.n_layers + 1} dispatches {before * 1e3:.1f} ms = {1 / before:.1f} tok/s; one module per token "
              f"({len(tok.launches)} launches, 1 dispatch, {'ok' if tok.ok else tok.first_violation()}) "
              f"{after * 1e3:.1f} ms = {1 / after:.1f} tok/s{host}")
        if name == "Llama-3.2-1B":
            rows = breakdown(tok)
            disp = cost.PARAMS.dispatch_overhead_s * 1e3
            launch = cost.PARAMS.launch_overhead_s * 1e3
            print(f"[bench]   per-launch breakdown of the {name} q4 token ({after * 1e3:.2f} ms: launches "
                  f"incl. {launch * 1e3:.1f} us overhead each + {disp:.2f} ms dispatch): " + ", ".join(
                      f"{g} {t:.2f} ms/{c} ({b})" for g, t, c, b in rows))
    return out


if __name__ == "__main__":
    bench_token_decode()
