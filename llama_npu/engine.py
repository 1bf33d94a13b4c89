"""The runtime: prefill (3 dispatches per layer, bucketed prompt lengths) + KV-cache decode (2 dispatches
per layer + CPU attention) + LM head GEMV, driven through one KernelCache.

What runs where (see docs/runtime.md): embedding gather, KV-cache writes, decode attention, final
RMSNorm of one row and sampling on the host; everything else on the device (npu / emu / null).
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from kernel_builder.numerics import BF16
from kernel_builder import reference

from .config import ModelConfig, load_config
from .errors import PromptError
from .kv_cache import KVCache
from .model_source import resolve_model
from .rope import RopeTable
from .sampling import Sampler
from .tokenizer import Tokenizer
from .weights import ModelWeights

DEFAULT_BUCKETS = (64, 256, 1024, 2048)


@dataclass
class PrefillResult:
    logits: np.ndarray                   # f32 [vocab] at the last real prompt row
    hidden: list[np.ndarray] | None      # per layer: f32 [prompt_len, H] (return_hidden=True)
    last_hidden: np.ndarray              # bf16 [H]: pre-final-norm hidden of the last real row
    prompt_len: int = 0
    bucket: int = 0


@dataclass
class GenerationResult:
    tokens: list[int]
    text: str
    ttft_s: float
    prefill_tok_s: float
    decode_tok_s: float
    ms_per_token: float
    stop_reason: str                     # "eos" | "length" | "interrupted"
    prompt_len: int = 0


def select_buckets(buckets: Sequence[int], context: int) -> tuple[int, ...]:
    """Sorted unique buckets that fit the model's context; a context smaller than every bucket
    becomes the only bucket (a tiny model still gets one prefill length)."""
    bs = sorted({int(b) for b in buckets})
    if not bs or bs[0] <= 0:
        raise ValueError(f"prefill buckets must be positive integers, got {list(buckets)}")
    fit = tuple(b for b in bs if b <= context)
    return fit or (context,)


# A chat turn that extends the cached conversation by at most this many tokens is fed through decode
# (one GEMV pass per token) instead of re-prefilling the whole history in a bucket.
MAX_EXTEND_TOKENS = 64


def check_budget(n_prompt: int, max_new_tokens: int, context: int) -> None:
    """Prompt + new tokens fit the model's context (PromptError). Any prompt length runs: beyond the largest
    bucket the rest of the prompt goes through decode (Engine.generate). Shared by the CLI's cheap
    pre-checks (before any weight is read) and Engine.generate."""
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens <= 0:
        raise PromptError(f"max_new_tokens must be a positive integer, got {max_new_tokens!r}")
    if n_prompt == 0:
        raise PromptError("empty prompt: nothing to run")
    if n_prompt + max_new_tokens > context:
        raise PromptError(f"prompt ({n_prompt} tokens) + N_TOKENS ({max_new_tokens}) = "
                          f"{n_prompt + max_new_tokens} exceeds the model's context of {context} tokens")


def _too_long(n_prompt: int, buckets: Sequence[int]) -> PromptError:
    return PromptError(f"prompt has {n_prompt} tokens but the largest compiled prefill bucket is "
                       f"{max(buckets)} (add a larger one with --buckets)")


def _bo(module: str, layer: int) -> str:
    """A layer's buffer-set key. It names the weight set, not the module: the KernelCache keys sets by
    (module, bo_key) and shares static buffers across a module family (every prefill bucket), so one
    layer's prefill weights are resident once however many buckets are compiled."""
    return f"L{layer}"


class Engine:
    def __init__(self, cfg: ModelConfig, tokenizer: Tokenizer, weights: ModelWeights, cache, buckets,
                 lm_plan: tuple[int, int], alias: bool = True):
        self.config = cfg
        # alias: activations flow between dispatches on the device (KernelCache refs); the host reads only
        # what it needs (K/V for the cache, the last layer's hidden). False = every hand-off via the host.
        self.alias = alias
        self.shapes = cfg.shapes
        self.tokenizer = tokenizer
        self.weights = weights
        self.cache = cache
        self.buckets = tuple(buckets)
        self.n_parts, self.part_rows = lm_plan
        s = cfg.shapes
        self._embed = weights.embed()
        self._final_norm = weights.final_norm()
        self.rope = RopeTable(s.head_dim, cfg.rope, initial=max(self.buckets))
        self.stop_ids = frozenset(cfg.eos_ids) | frozenset(tokenizer.eos_ids)
        self.pad_id = min(self.stop_ids) if self.stop_ids else 0
        self.kv: KVCache | None = None
        self.pos = 0
        self.tokens: list[int] = []    # the ids whose K/V are in the cache (positions 0..pos-1)
        self.last_hidden: np.ndarray | None = None
        self.host_attn_s = 0.0          # CPU decode-attention time since the last reset_timers()
        self._logit_names = [f"logits_{p}" for p in range(self.n_parts)]

    # ------------------------------------------------------------------------------------ loading
    @classmethod
    def load(cls, model: str | None = None, device: str = "auto", buckets: Sequence[int] = DEFAULT_BUCKETS,
             cache_dir: str | Path | None = None, progress: bool = True, warmup: bool = True,
             alias: bool = True) -> "Engine":
        """Resolve the model, validate it (config before any weight), build or reuse every kernel
        module, upload all weights into per-layer buffer sets and (warmup) run one untimed prefill in
        the smallest bucket and one decode step, so one-time device work (binary loads, emu's f32
        shadows of the weights) stays out of the first timed request."""
        from kernel_builder.build import build_modules
        from kernel_builder.cache import KernelCache
        from kernel_builder.devices import make_device
        from kernel_builder.planner import plan_lm_head
        from multi_launch_builder import registry

        from .embedded import cache_root

        model_dir = resolve_model(model, progress=progress)
        cfg = load_config(model_dir)
        tokenizer = Tokenizer(model_dir)
        dev = make_device(device)
        weights = ModelWeights(cfg)  # headers + shapes checked; data is read lazily
        bs = select_buckets(buckets, cfg.max_position)
        decls = list(registry.all_modules(cfg.shapes, list(bs)))
        kind = getattr(dev, "name", "emu")
        cache_dir = Path(cache_dir) if cache_dir else cache_root() / "kernels"
        report = build_modules(decls, cache_dir, kind, progress=progress)
        cache = KernelCache(dev, report.artifacts, decls)
        plan = plan_lm_head(cfg.shapes.vocab, cfg.shapes.hidden)
        eng = cls(cfg, tokenizer, weights, cache, bs, (plan.n_parts, plan.part_rows), alias=alias)
        eng.preload(progress=progress)
        if warmup:
            eng.warmup()
        return eng

    def preload(self, progress: bool = True) -> None:
        """Write every static (weights, prefill LUTs, LM-head partitions) once, before any timed call.
        Each layer's transposed prefill copies live only while that layer is uploaded."""
        from tqdm import tqdm

        c, n_layers = self.cache, self.shapes.n_layers
        luts = {b: self.rope.rows(b) for b in self.buckets}
        for layer in tqdm(range(n_layers), desc="uploading weights", unit="layer", disable=not progress,
                          leave=False):
            rgr, off = self.weights.prefill_statics(layer)
            for b in self.buckets:
                c.write_static(f"rms_gemms_rope_s{b}", bo_key=_bo(f"rms_gemms_rope_s{b}", layer), lut=luts[b], **rgr)
                c.write_static(f"o_ffn_s{b}", bo_key=_bo(f"o_ffn_s{b}", layer), **off)
            del rgr, off
            drgr, dogf = self.weights.decode_statics(layer)
            c.write_static("rms_gemv_rope", bo_key=_bo("rms_gemv_rope", layer), **drgr)
            c.write_static("o_gemv_ffn", bo_key=_bo("o_gemv_ffn", layer), **dogf)
        c.write_static("lm_head_gemv", bo_key="lm_head_gemv",
                       **self.weights.lm_head_partitions(self.n_parts, self.part_rows))
        c.reset_counters()  # the profile counts inference traffic, not the one-time upload

    def warmup(self) -> None:
        """One untimed prefill (smallest bucket) + decode step + LM head; then a clean state."""
        self.prefill([self.pad_id])
        self.decode_step(self.pad_id)
        self.reset()
        self.host_attn_s = 0.0
        self.cache.reset_counters()

    # ------------------------------------------------------------------------------------ helpers
    def bucket_for(self, n: int) -> int:
        for b in self.buckets:
            if b >= n:
                return b
        raise _too_long(n, self.buckets)

    def _check_ids(self, token_ids: Sequence[int]) -> list[int]:
        ids = [int(t) for t in token_ids]
        if not ids:
            raise PromptError("empty prompt: nothing to run")
        bad = [t for t in ids if not 0 <= t < self.shapes.vocab]
        if bad:
            raise PromptError(f"token id {bad[0]} is outside the vocabulary [0, {self.shapes.vocab})")
        return ids

    def _ensure_kv(self, capacity: int) -> KVCache:
        """A KV cache with at least `capacity` positions (never beyond the model's context); grows by
        doubling and keeps the entries already written."""
        s = self.shapes
        if capacity > self.config.max_position:
            raise PromptError(f"position {capacity - 1} is beyond the model's context of "
                              f"{self.config.max_position} tokens")
        kv = self.kv
        if kv is not None and kv.max_seq >= capacity:
            return kv
        size = capacity if kv is None else min(max(capacity, 2 * kv.max_seq), self.config.max_position)
        new = KVCache(s.n_layers, s.n_kv_heads, size, s.head_dim, s.n_heads)
        if kv is not None:
            n = kv.max_seq
            new.k[:, :, :n], new.v[:, :, :n] = kv.k, kv.v
            new._kf[:, :, :n], new._vf[:, :, :n] = kv._kf, kv._vf
        self.kv = new
        return new

    def _lm_head(self, row: np.ndarray) -> np.ndarray:
        """Final RMSNorm on one row (host) + the single-row LM-head GEMV (device) -> f32 [vocab]."""
        s = self.shapes
        normed = reference.rmsnorm(row, self._final_norm, rows=1, dim=s.hidden, eps=s.rms_eps)
        out = self.cache.load_and_run("lm_head_gemv", bo_key="lm_head_gemv", x=normed.reshape(1, s.hidden))
        logits = np.concatenate([out[n].reshape(-1) for n in self._logit_names])
        return logits[: s.vocab].astype(np.float32)

    def reset(self) -> None:
        """Forget the conversation: the next prefill starts at position 0."""
        self.pos = 0
        self.tokens = []
        self.last_hidden = None
        if self.kv is not None:
            self.kv.reset()

    # ------------------------------------------------------------------------------------ prefill
    def prefill(self, token_ids: Sequence[int], return_hidden: bool = False,
                bucket: int | None = None, kv_capacity: int | None = None) -> PrefillResult:
        """Run the prompt from position 0 in the smallest bucket >= its length (or `bucket`), fill the
        KV cache with its real rows and return the logits of the last real row."""
        ids = self._check_ids(token_ids)
        n = len(ids)
        s = self.shapes
        b = bucket if bucket is not None else self.bucket_for(n)
        if b not in self.buckets or b < n:
            raise PromptError(f"bucket {b} cannot hold a {n}-token prompt (compiled: {list(self.buckets)})")
        self.reset()
        kv = self._ensure_kv(kv_capacity or min(n + 64, self.config.max_position))
        padded = np.full(b, self.pad_id, dtype=np.int64)
        padded[:n] = ids
        x = np.asarray(self._embed[padded], dtype=BF16)  # [b, H] gather on the host
        rgr, fa, off = f"rms_gemms_rope_s{b}", f"flash_attn_s{b}", f"o_ffn_s{b}"
        run = self.cache.load_and_run
        hidden = [] if return_hidden else None
        if self.alias:
            ref = self.cache.ref
            last = s.n_layers - 1
            for layer in range(s.n_layers):
                # layer 0 takes the host embedding; later layers the previous o_ffn's x_out, on the device
                x_in = x if layer == 0 else ref(off, "x_out")
                o1 = run(rgr, bo_key=_bo(rgr, layer), x=x_in, read=("k_roped", "v"))
                kv.write_prefill(layer, o1["k_roped"], o1["v"], n)
                run(fa, bo_key=fa, q=ref(rgr, "q_roped"), k=ref(rgr, "k_roped"), v=ref(rgr, "v"), read=())
                # the residual x is whatever rgr read (for layer > 0 that is o_ffn's own x_out buffer:
                # safe, o_ffn reads x before its last launch writes x_out; KernelCache checks this)
                need = hidden is not None or layer == last
                o3 = run(off, bo_key=_bo(off, layer), attn=ref(fa, "attn"), x=ref(rgr, "x"),
                         read=("x_out",) if need else ())
                if need:
                    x = o3["x_out"].reshape(b, s.hidden)
                if hidden is not None:
                    hidden.append(x[:n].astype(np.float32))
        else:
            for layer in range(s.n_layers):
                o1 = run(rgr, bo_key=_bo(rgr, layer), x=x)
                kv.write_prefill(layer, o1["k_roped"], o1["v"], n)
                o2 = run(fa, bo_key=fa, q=o1["q_roped"], k=o1["k_roped"], v=o1["v"])
                o3 = run(off, bo_key=_bo(off, layer), attn=o2["attn"], x=x)
                x = o3["x_out"].reshape(b, s.hidden)
                if hidden is not None:
                    hidden.append(x[:n].astype(np.float32))
        last = np.array(x[n - 1])
        kv.length = n
        self.pos = n
        self.tokens = list(ids)
        self.last_hidden = last
        return PrefillResult(self._lm_head(last.reshape(1, s.hidden)), hidden, last, n, b)

    # ------------------------------------------------------------------------------------ decode
    def decode_step(self, token_id: int) -> np.ndarray:
        """Feed one token at the current position; returns f32 logits [vocab] and advances."""
        if self.pos == 0:
            raise PromptError("decode_step before prefill: run a prompt first")
        self._check_ids([token_id])
        s = self.shapes
        pos = self.pos
        kv = self._ensure_kv(pos + 1)
        x = np.asarray(self._embed[int(token_id)], dtype=BF16).reshape(1, s.hidden)
        lut = self.rope.row(pos)
        run = self.cache.load_and_run
        attn_s = 0.0
        alias, last = self.alias, s.n_layers - 1
        if alias:  # x stays on the device between layers (only the last layer's x_out is read back)
            prev_out, layer_in = self.cache.ref("o_gemv_ffn", "x_out"), self.cache.ref("rms_gemv_rope", "x")
            lut_ref = self.cache.ref("rms_gemv_rope", "lut")  # the position's RoPE row: written once per token
        for layer in range(s.n_layers):
            x_in = prev_out if alias and layer else x
            o1 = run("rms_gemv_rope", bo_key=_bo("rms_gemv_rope", layer), x=x_in,
                     lut=lut_ref if alias and layer else lut)
            t0 = time.perf_counter()
            attn = kv.attend(layer, pos, o1["q_roped"], o1["k_roped"], o1["v"])
            attn_s += time.perf_counter() - t0
            if alias:
                o3 = run("o_gemv_ffn", bo_key=_bo("o_gemv_ffn", layer), attn=attn,
                         x=layer_in, read=("x_out",) if layer == last else ())
                if layer == last:
                    x = o3["x_out"].reshape(1, s.hidden)
            else:
                x = run("o_gemv_ffn", bo_key=_bo("o_gemv_ffn", layer), attn=attn, x=x)["x_out"].reshape(1, s.hidden)
        self.host_attn_s += attn_s
        kv.length = pos + 1
        self.pos = pos + 1
        self.tokens.append(int(token_id))
        self.last_hidden = x.reshape(s.hidden)
        return self._lm_head(x)

    # ------------------------------------------------------------------------------------ generate
    def check_budget(self, n_prompt: int, max_new_tokens: int) -> None:
        check_budget(n_prompt, max_new_tokens, self.config.max_position)

    def reusable_prefix(self, token_ids: Sequence[int]) -> bool:
        """True when `token_ids` extends the tokens already in the KV cache (a chat turn appended to the
        conversation) by few enough tokens to feed them one by one through decode, instead of
        re-prefilling the whole history; always true when the history no longer fits any bucket."""
        have, n = self.pos, len(token_ids)
        if not 0 < have < n or list(token_ids[:have]) != self.tokens:
            return False
        # Feeding n - have tokens must not cost more decode passes than a fresh run would (which prefills
        # max(buckets) tokens and decodes only the rest).
        return n - have <= max(MAX_EXTEND_TOKENS, n - max(self.buckets))

    def generate(self, token_ids: Sequence[int], max_new_tokens: int, sampler: Sampler | None = None,
                 on_token: Callable[[int, str], None] | None = None,
                 on_logits: Callable[[int, np.ndarray], None] | None = None,
                 stop_event: threading.Event | None = None, reuse_kv: bool = False) -> GenerationResult:
        """Prefill `token_ids` and decode up to `max_new_tokens`. With reuse_kv (chat), a prompt that extends
        the conversation already in the KV cache only feeds its new tokens (see reusable_prefix)."""
        ids = self._check_ids(token_ids)
        reuse = reuse_kv and self.reusable_prefix(ids)
        self.check_budget(len(ids), max_new_tokens)
        sampler = sampler or Sampler()
        stream = _TextStream(self.tokenizer, on_token)
        t0 = time.perf_counter()
        n_fed = len(ids) - self.pos if reuse else len(ids)  # prompt tokens actually computed now
        if reuse:
            self._ensure_kv(len(ids) + max_new_tokens)
            for t in ids[self.pos:]:
                first_logits = self.decode_step(t)
        else:
            # A prompt longer than the largest bucket: prefill that much, feed the rest through decode.
            big = max(self.buckets)
            first_logits = self.prefill(ids[:big], kv_capacity=len(ids) + max_new_tokens).logits
            for t in ids[big:]:
                first_logits = self.decode_step(t)
        if on_logits is not None:
            on_logits(0, first_logits)
        tok = sampler(first_logits)
        t_first = time.perf_counter()
        tokens = [tok]
        stream.push(tokens)
        stop_reason = "eos" if tok in self.stop_ids else "length"
        step = 0
        while stop_reason == "length" and len(tokens) < max_new_tokens:
            if stop_event is not None and stop_event.is_set():
                stop_reason = "interrupted"
                break
            step += 1
            logits = self.decode_step(tok)
            if on_logits is not None:
                on_logits(step, logits)
            tok = sampler(logits)
            tokens.append(tok)
            stream.push(tokens)
            if tok in self.stop_ids:
                stop_reason = "eos"
        t_end = time.perf_counter()
        ttft = t_first - t0
        n_dec = len(tokens) - 1
        dec_s = t_end - t_first
        return GenerationResult(
            tokens=tokens, text=self.tokenizer.decode(tokens), ttft_s=ttft,
            prefill_tok_s=n_fed / ttft if ttft > 0 else float("inf"),
            decode_tok_s=n_dec / dec_s if n_dec and dec_s > 0 else 0.0,
            ms_per_token=1e3 * dec_s / n_dec if n_dec else 0.0,
            stop_reason=stop_reason, prompt_len=len(ids))


class _TextStream:
    """Turns the growing token list into text deltas with a constant amount of decoding per token.

    Only a short window is decoded: the tokens since the last emitted text (`read`) plus the few before
    them (`prefix`, so word-boundary spaces decode as in the full text). A window ending in U+FFFD (an
    incomplete UTF-8 sequence split across tokens) is held back until the next token completes it."""

    def __init__(self, tokenizer: Tokenizer, on_token):
        self.tokenizer, self.on_token = tokenizer, on_token
        self.prefix = self.read = 0

    def push(self, tokens: list[int]) -> None:
        if self.on_token is None:
            return
        decode = self.tokenizer.decode
        before = decode(tokens[self.prefix:self.read])
        text = decode(tokens[self.prefix:])
        delta = ""
        if len(text) > len(before) and not text.endswith("\ufffd"):
            delta = text[len(before):]
            self.prefix, self.read = self.read, len(tokens)
        self.on_token(tokens[-1], delta)
