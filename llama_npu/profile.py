"""`llama-npu profile` tables: per-module device counters from the ModuleExecutor plus host time per token."""
from __future__ import annotations


def _mb(n: int) -> str:
    return f"{n / 1e6:10.3f}"


def module_table(rows: list[dict]) -> str:
    """rows = ModuleExecutor.report(): calls, ms (write/run/read), MB written/read per module."""
    w = max([len("module")] + [len(r["module"]) for r in rows])
    head = (f"{'module':<{w}}  {'calls':>6}  {'total ms':>9}  {'run ms':>9}  {'write ms':>9}  {'read ms':>8}"
            f"  {'ms/call':>8}  {'MB written':>10}  {'MB read':>10}")
    lines = [head, "-" * len(head)]
    tot = {"calls": 0, "ms": 0.0, "run": 0.0, "write": 0.0, "read": 0.0, "bw": 0, "br": 0}
    for r in rows:
        ms = 1e3 * (r["write_s"] + r["run_s"] + r["read_s"])
        per = ms / r["calls"] if r["calls"] else 0.0
        lines.append(f"{r['module']:<{w}}  {r['calls']:>6}  {ms:9.1f}  {1e3 * r['run_s']:9.1f}  "
                     f"{1e3 * r['write_s']:9.1f}  {1e3 * r['read_s']:8.1f}  {per:8.2f}  "
                     f"{_mb(r['bytes_written'])}  {_mb(r['bytes_read'])}")
        tot["calls"] += r["calls"]
        tot["ms"] += ms
        tot["run"] += 1e3 * r["run_s"]
        tot["write"] += 1e3 * r["write_s"]
        tot["read"] += 1e3 * r["read_s"]
        tot["bw"] += r["bytes_written"]
        tot["br"] += r["bytes_read"]
    lines.append("-" * len(head))
    lines.append(f"{'total':<{w}}  {tot['calls']:>6}  {tot['ms']:9.1f}  {tot['run']:9.1f}  {tot['write']:9.1f}  "
                 f"{tot['read']:8.1f}  {'':>8}  {_mb(tot['bw'])}  {_mb(tot['br'])}")
    return "\n".join(lines)


def device_seconds(rows: list[dict]) -> float:
    return sum(r["write_s"] + r["run_s"] + r["read_s"] for r in rows)


def split_rows(before: list[dict], after: list[dict]) -> list[dict]:
    """Counter rows of `after` minus `before` (per module), dropping modules with no new calls."""
    prev = {r["module"]: r for r in before}
    out = []
    for r in after:
        p = prev.get(r["module"])
        d = dict(r)
        if p is not None:
            for k in ("calls", "bytes_written", "static_bytes_written", "bytes_read", "write_s", "run_s", "read_s"):
                d[k] = r[k] - p[k]
        if d["calls"]:
            out.append(d)
    return out


def summary(prefill_wall_s: float, prefill_rows: list[dict], decode_wall_s: float, decode_rows: list[dict],
            n_decode: int, host_attn_s: float, prompt_len: int, bucket: int | str) -> str:
    """Where the time goes: wall vs device time for prefill, and per decode token."""
    lines = []
    pdev = device_seconds(prefill_rows)
    lines.append(f"prefill: {prompt_len} tokens in bucket {bucket}: wall {1e3 * prefill_wall_s:.1f} ms, "
                 f"device {1e3 * pdev:.1f} ms, host {1e3 * (prefill_wall_s - pdev):.1f} ms")
    if n_decode:
        ddev = device_seconds(decode_rows)
        dispatches = sum(r["calls"] for r in decode_rows) / n_decode
        lines.append(f"decode:  {n_decode} tokens: wall {1e3 * decode_wall_s / n_decode:.2f} ms/token, "
                     f"device {1e3 * ddev / n_decode:.2f} ms/token, "
                     f"host {1e3 * (decode_wall_s - ddev) / n_decode:.2f} ms/token "
                     f"(of which CPU attention {1e3 * host_attn_s / n_decode:.2f}), "
                     f"{dispatches:.0f} dispatches/token")
    return "\n".join(lines)


def profile_main(eng, ids: list[int], n_tokens: int, sampler):
    """`llama-npu profile`: generate once and print the per-module tables of prefill and decode + a summary;
    returns the GenerationResult (the CLI prints its timings line)."""
    import time

    eng.cache.reset_counters()
    eng.host_attn_s = 0.0
    mark: dict = {}

    def on_logits(step, _logits):
        if step == 0:
            mark["t"] = time.perf_counter()
            mark["rows"] = eng.cache.report()

    chunks = eng.chunks(len(ids), 0)   # the prefill chunks generate() runs (bucket sizes)
    t0 = time.perf_counter()
    res = eng.generate(ids, n_tokens, sampler=sampler, on_logits=on_logits)
    t_end = time.perf_counter()
    prefill_rows = mark["rows"]
    decode_rows = split_rows(prefill_rows, eng.cache.report())
    buckets = "+".join(str(rows) for _, rows in chunks)
    print(res.text)
    print()
    print(f"== prefill ({len(ids)} tokens, " + (f"bucket {buckets}" if len(chunks) == 1 else f"chunks {buckets}")
          + ") ==")
    print(module_table(prefill_rows))
    print()
    print(f"== decode ({len(res.tokens) - 1} tokens) ==")
    print(module_table(decode_rows))
    print()
    print(summary(mark["t"] - t0, prefill_rows, t_end - mark["t"], decode_rows, len(res.tokens) - 1,
                  eng.host_attn_s, len(ids), buckets))
    return res
