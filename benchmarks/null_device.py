"""Llama-3.2-1B shapes on the null-compute device: what the host and the transfers cost per token.

The checkpoint is a *sparse* safetensors file (header + a hole of zeros): it has the exact tensor names and
shapes of Llama-3.2-1B, takes no disk space and no download, and exercises the same loader, layout
preparation, ModuleExecutor and dispatch path as a real model. The null device counts dispatches and bytes
but computes nothing, so logits are zeros; decode is therefore driven step by step instead of sampling.
"""
from __future__ import annotations

import json
import math
import shutil
import struct
import tempfile
import time
from pathlib import Path

from llama_npu.models.llama import GLOBAL_TENSORS, LLAMA32_1B, LlamaModel, ModelShapes

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json")


def llama_tensor_shapes(s: ModelShapes, tied: bool) -> dict[str, tuple[int, ...]]:
    """HF state-dict names -> shapes (as stored), from the model description's tensor map."""
    shapes = {GLOBAL_TENSORS["embed"]: (s.vocab, s.hidden), GLOBAL_TENSORS["final_norm"]: (s.hidden,)}
    if not tied:
        shapes[GLOBAL_TENSORS["lm_head"]] = (s.vocab, s.hidden)
    for i in range(s.n_layers):
        for hf, shape in LlamaModel(s).layer_tensors().values():
            shapes[f"model.layers.{i}.{hf}"] = shape
    return shapes


def write_sparse_checkpoint(out: Path, s: ModelShapes, tokenizer_dir: Path, tied: bool = True) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    header, offset = {}, 0
    for name, shape in llama_tensor_shapes(s, tied).items():
        n = 2
        for d in shape:
            n *= d
        header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [offset, offset + n]}
        offset += n
    blob = json.dumps(header).encode()
    blob += b" " * (-len(blob) % 8)
    with open(out / "model.safetensors", "wb") as f:
        f.write(struct.pack("<Q", len(blob)) + blob)
        f.truncate(8 + len(blob) + offset)  # a hole: reads as zeros, occupies no blocks
    (out / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": s.hidden,
        "num_attention_heads": s.n_heads, "num_key_value_heads": s.n_kv_heads, "head_dim": s.head_dim,
        "intermediate_size": s.ffn, "num_hidden_layers": s.n_layers, "vocab_size": s.vocab,
        "rms_norm_eps": s.rms_eps, "rope_theta": 500000.0, "max_position_embeddings": 131072,
        "rope_scaling": {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                         "original_max_position_embeddings": 8192},
        "tie_word_embeddings": tied, "hidden_act": "silu", "attention_bias": False, "mlp_bias": False,
        "bos_token_id": 1, "eos_token_id": 2, "torch_dtype": "bfloat16"}))
    for fname in TOKENIZER_FILES:
        if (tokenizer_dir / fname).exists():
            shutil.copy2(tokenizer_dir / fname, out / fname)
    return out


def bench_null_llama32_1b(n_tokens: int = 8, prompt_len: int = 30, bucket: int = 64, handoff: str = "device") -> dict:
    from llama_npu.engine import Engine
    from llama_npu.model_source import resolve_model

    tok_dir = resolve_model(None, progress=False)  # the embedded model's tokenizer is enough here
    with tempfile.TemporaryDirectory(prefix="llama32-1b-null-") as tmp:
        model_dir = write_sparse_checkpoint(Path(tmp) / "model", LLAMA32_1B, tok_dir, tied=True)
        t0 = time.perf_counter()
        eng = Engine.load(str(model_dir), device="null", buckets=(bucket,), cache_dir=Path(tmp) / "kernels",
                          progress=False, warmup=False, handoff=handoff)
        load_s = time.perf_counter() - t0
        cache = eng.cache
        ids = list(range(3, 3 + prompt_len))

        eng.prefill(ids)  # first call of every bo_key writes the weights: not what a steady pass costs
        eng.reset()
        cache.reset_counters()
        t0 = time.perf_counter()
        eng.prefill(ids)
        prefill_host_s = time.perf_counter() - t0   # everything but device compute (the null device computes nothing)
        pre = _totals(cache)

        cache.reset_counters()
        t0 = time.perf_counter()
        for i in range(n_tokens):
            eng.decode_step(5 + i)
        host_s = (time.perf_counter() - t0) / n_tokens
        dec = _totals(cache)
        one = None
        if eng.token_decode is not None:    # greedy: the one-module token (llama_npu/token_decode.py)
            eng.decode_next(5)              # (the window's module is built on its first use: not timed)
            cache.reset_counters()
            t0 = time.perf_counter()
            for i in range(n_tokens):
                eng.decode_next(6 + i)
            one = (_totals(cache), (time.perf_counter() - t0) / n_tokens)
        mem = cache.memory_report()["cache_allocated_bytes"]
    res = {
        "device_bytes": mem,
        "load_s": load_s,
        "prefill_dispatches": pre["calls"], "prefill_bytes_written": pre["w"], "prefill_bytes_read": pre["r"],
        "decode_dispatches_per_token": dec["calls"] / n_tokens,
        "decode_bytes_written_per_token": dec["w"] / n_tokens, "decode_bytes_read_per_token": dec["r"] / n_tokens,
        "host_ms_per_decode_token": host_s * 1e3,
        "host_s_per_prefill": prefill_host_s, "prompt_len": prompt_len,
    }
    print(f"[bench] Llama-3.2-1B shapes on null device (prompt {prompt_len} in bucket {bucket}, "
          f"{'device-side hand-off' if handoff == 'device' else 'host round trips'}, "
          f"setup {load_s:.1f} s):")
    print(f"[bench]   prefill pass: {res['prefill_dispatches']} dispatches, "
          f"{_mb(res['prefill_bytes_written'])} written + {_mb(res['prefill_bytes_read'])} read host<->device, "
          f"host time {prefill_host_s * 1e3:.1f} ms (no device compute)")
    print(f"[bench]   decode with logits (sampling, processors): {res['decode_dispatches_per_token']:.0f} "
          f"dispatches/token, "
          f"{_kb(res['decode_bytes_written_per_token'])} written + {_kb(res['decode_bytes_read_per_token'])} "
          f"read per token, host time {res['host_ms_per_decode_token']:.2f} ms/token (no device compute)")
    if one is not None:
        (t, one_s) = one
        res.update(greedy_dispatches_per_token=t["calls"] / n_tokens,
                   greedy_bytes_written_per_token=t["w"] / n_tokens, greedy_bytes_read_per_token=t["r"] / n_tokens,
                   greedy_host_ms_per_token=one_s * 1e3)
        print(f"[bench]   greedy decode, one module per token: {res['greedy_dispatches_per_token']:.0f} "
              f"dispatch/token, {res['greedy_bytes_written_per_token']:.0f} B written + "
              f"{res['greedy_bytes_read_per_token']:.0f} B read "
              f"per token (target <= 64 + 64), host time {one_s * 1e3:.2f} ms/token (no device compute)")
    print(f"[bench]   device buffers (weights resident per layer + one activation set per module + "
          f"KV cache and RoPE table): {_mb(res['device_bytes'])}")
    return res


def bench_memory_plan(shapes: ModelShapes = LLAMA32_1B, buckets=(64, 256, 1024, 2048),
                      contexts=(2048, 8192, 32768)) -> None:
    """Device buffers of a run with the default buckets (llama_npu.memory.plan_memory: the figure the
    ModuleExecutor allocates, equal on the null device - tests/test_memory_plan.py), the KV cache apart."""
    from llama_npu.memory import fmt, plan_memory

    for ctx in contexts:
        p = plan_memory(shapes, buckets, ctx)
        print(f"[bench] Llama-3.2-1B device buffers, buckets {list(buckets)}, context {ctx}: "
              f"{fmt(p.weights_bytes + p.activation_bytes)} (weights {fmt(p.weights_bytes)} + activations "
              f"{fmt(p.activation_bytes)}; target <= 2.9 GiB) + KV cache and RoPE table {fmt(p.kv_cache_bytes)}")


_COLD_PLAN = """
import time
t0 = time.perf_counter()
from llama_npu.memory import plan_memory
from llama_npu.models.llama import LLAMA32_1B
t1 = time.perf_counter()
plan_memory(LLAMA32_1B, (64, 256, 1024, 2048), 32768)
t2 = time.perf_counter()
print(t2 - t0, t1 - t0)
"""


def bench_cold_plan() -> float:
    """The memory check of `llama-npu doctor` / Engine.load for Llama-3.2-1B at a 32k context in a fresh
    interpreter (imports included): every phase's module declarations, no MLIR generated (the build derives
    the aircc presets). Target < 1 s."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", _COLD_PLAN], capture_output=True, text=True, check=True).stdout
    total, imports = map(float, out.split())
    print(f"[bench] cold memory check (all plans + plan_memory) for Llama-3.2-1B at a 32k context: {total:.2f} s "
          f"(imports {imports:.2f} s; target < 1 s)")
    return total


def bench_load_rss(shapes: ModelShapes = LLAMA32_1B) -> int:
    """Peak host RSS of a process that loads a model of these shapes on the null device (weights are read
    from the checkpoint straight into device buffers: the host holds at most one tensor in flight besides
    them). Runs in a fresh interpreter so nothing else of the bench inflates the figure."""
    import subprocess
    import sys

    from llama_npu.model_source import resolve_model

    tok_dir = resolve_model(None, progress=False)
    with tempfile.TemporaryDirectory(prefix="llama-rss-") as tmp:
        model_dir = write_sparse_checkpoint(Path(tmp) / "model", shapes, tok_dir, tied=False)
        # VmHWM (this process's peak RSS; ru_maxrss would carry over the parent's peak across fork + exec), and
        # after the load its anonymous and file-backed parts (the checkpoint is read through safetensors' mmap: its
        # pages count in RSS while mapped, clean page cache the kernel reclaims, not memory the process allocated)
        code = ("import re\n"
                "st = lambda k: int(re.search(k + r':\\s+(\\d+)', open('/proc/self/status').read()).group(1))\n"
                "from llama_npu.engine import Engine\n"
                "base = st('VmHWM')\n"
                f"e = Engine.load({str(model_dir)!r}, device='null', buckets=(64,), cache_dir={tmp!r} + '/k', "
                "progress=False, warmup=False)\n"
                "print(base, st('VmHWM'), st('RssAnon'), st('RssFile'))\n")
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    base_kib, peak_kib, anon_kib, file_kib = (int(v) for v in out.split())
    largest = max(2 * math.prod(sh) for sh in llama_tensor_shapes(shapes, tied=False).values())
    print(f"[bench] peak host RSS loading Llama-3.2-1B shapes (null device, untied, {_mb(_ckpt_bytes(shapes))} "
          f"of weights): {peak_kib / 1024:.0f} MiB (interpreter + imports {base_kib / 1024:.0f} MiB; the largest "
          f"tensor is {_mb(largest)}); after the load {anon_kib / 1024:.0f} MiB anonymous + {file_kib / 1024:.0f} "
          f"MiB file-backed (the checkpoint's mmap'd pages: page cache, not allocated)")
    return peak_kib * 1024


def _ckpt_bytes(shapes: ModelShapes) -> int:
    return sum(2 * math.prod(sh) for sh in llama_tensor_shapes(shapes, tied=False).values())


def _totals(cache) -> dict:
    rows = cache.report()
    get = lambda r, k: r[k] if isinstance(r, dict) else getattr(r, k)  # noqa: E731
    return {"calls": sum(get(r, "calls") for r in rows), "w": sum(get(r, "bytes_written") for r in rows),
            "r": sum(get(r, "bytes_read") for r in rows)}


def _mb(n: float) -> str:
    return f"{n / 2**20:.2f} MiB"


def _kb(n: float) -> str:
    return f"{n / 2**10:.1f} KiB"
