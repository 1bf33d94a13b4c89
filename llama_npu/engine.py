"""The runtime: walks the model description's phase plans through one ModuleExecutor
(multi_launch_builder.executor).

Prefill runs a prompt in the smallest bucket that holds it (3 dispatches per layer: attention inputs with the
K/V append, attention, the rest); decode feeds one token through ONE fused module per layer (attention on the
NPU over the cache window), so a token is n_layers + 1 dispatches with the LM head (final RMSNorm +
vocabulary GEMVs). With --decode-attention host, decode runs the attention-input and FFN modules with the CPU
attention between them. Both phases go through `run_layers`, which binds every module input from where the plan
says it comes from: the layer input, another module's output (a ref: on the device, or through the host when
the executor's hand-off policy says so), or a host step (the CPU decode attention). The KV cache and the RoPE
table are device states; the host writes embeddings and positions, and reads logits.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Sequence

import numpy as np

from multi_launch_builder.decl import Role
from kernel_builder.numerics import BF16, to_bf16

from .config import ModelConfig, load_config, select_buckets  # noqa: F401 (re-exported)
from .errors import PromptError
from .host_attention import K_CACHE, V_CACHE, HostAttention
from .model_source import resolve_model
from .models.graph import PhasePlan, call_scalars, layer_plan
from .rope import RopeTable
from .processors import log_softmax
from .sampling import Sampler
from .tokenizer import Tokenizer
from .weights import ModelWeights

from .sizes import DEFAULT_BUCKETS  # noqa: E402,F401 (re-exported: the CLI, benchmarks and tests import it here)
HANDOFFS = ("device", "host")
DECODE_ATTENTION = ("npu", "host")
# A chat turn that extends the cached conversation by at most this many tokens is fed through decode
# (one pass per token); a longer one runs as a prefill chunk on top of the cache.
DECODE_FEED_TOKENS = 4


@dataclass
class PrefillResult:
    logits: np.ndarray                   # f32 [vocab] at the last real prompt row
    hidden: list[np.ndarray] | None      # per layer: f32 [prompt_len, H] (return_hidden=True)
    last_hidden: np.ndarray | None       # bf16 [H]: pre-final-norm hidden of the last real row (when read)
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
    prompt_computed: int = 0             # prompt tokens computed by this call (the rest came from the KV cache)


def check_budget(n_prompt: int, max_new_tokens: int, context: int, what: str = "the model's context") -> None:
    """Prompt + new tokens fit the context (PromptError). Shared by the CLI's cheap pre-checks (before any
    weight is read) and Engine.generate."""
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens <= 0:
        raise PromptError(f"max_new_tokens must be a positive integer, got {max_new_tokens!r}")
    if n_prompt == 0:
        raise PromptError("empty prompt: nothing to run")
    if n_prompt + max_new_tokens > context:
        raise PromptError(f"prompt ({n_prompt} tokens) + N_TOKENS ({max_new_tokens}) = "
                          f"{n_prompt + max_new_tokens} exceeds {what} of {context} tokens")


def layer_key(layer: int) -> str:
    """A layer's buffer-set key: its weights (shared by every module of the layer family) and KV cache."""
    return f"L{layer}"


def run_layers(cache, plans, x: np.ndarray, pos: int, n_layers: int, host_op=None,
               read_hidden: bool = False, read_last: bool = False) -> list[np.ndarray]:
    """Run `n_layers` layers of `plans` (one PhasePlan for every layer, or a tuple of each layer's) on the host
    rows `x` at position `pos`: every module input is bound where the plan says it comes from (layer 0's input:
    `x`; later layers: the previous layer's output; a module output: a ref; a host step:
    `host_op(step, layer, pos, results)`'s array). Returns the layer outputs read back (every layer with
    read_hidden, the last one with read_last)."""
    run, ref = cache.load_and_run, cache.ref
    hidden = []
    out_module = None                    # the module holding the previous layer's output
    for layer in range(n_layers):
        plan = layer_plan(plans, layer)
        out_step, out_arg = plan.output
        host_reads = {i: [src.arg for st in plan.steps if st.decl is None for src in st.inputs.values()
                          if src.step == i] for i in range(len(plan.steps))}
        bo = layer_key(layer)
        host_vals: dict[int, np.ndarray] = {}
        results: dict[int, dict] = {}
        for i, step in enumerate(plan.steps):
            if step.decl is None:
                host_vals[i] = host_op(step, layer, pos, results)
                continue
            args = {}
            for name, src in step.inputs.items():
                if src.step < 0:     # the layer input: the host rows, then the previous layer's output
                    args[name] = x if layer == 0 else ref(out_module, prev_arg)
                elif src.host:
                    args[name] = host_vals[src.step]
                else:
                    args[name] = ref(plan.steps[src.step].decl.name, src.arg)
            wanted = set(host_reads[i])
            if i == out_step and (read_hidden or (read_last and layer == n_layers - 1)):
                wanted.add(out_arg)
            scalars = call_scalars(step.decl, pos)
            results[i] = run(step.decl.name, bo_key=bo, read=wanted, **scalars, **args)
        if out_arg in results.get(out_step, {}):
            hidden.append(results[out_step][out_arg])
        out_module, prev_arg = plan.steps[out_step].decl.name, out_arg
    return hidden


class Engine:
    def __init__(self, cfg: ModelConfig, tokenizer: Tokenizer, weights: ModelWeights, cache, buckets,
                 context: int | None = None, decode_attention: str = "npu"):
        if decode_attention not in DECODE_ATTENTION:
            raise ValueError(f"decode_attention must be one of {DECODE_ATTENTION}, got {decode_attention!r}")
        self.config = cfg
        self.context = context or cfg.max_position   # positions this run may hold (--context)
        self.decode_attention = decode_attention
        self.shapes = cfg.shapes
        self.tokenizer = tokenizer
        self.weights = weights
        self.model = weights.model
        self.cache = cache
        self.buckets = tuple(buckets)
        self.windows = self.model.kv_windows(self.context)        # KV-cache windows attention is built for
        self.plans = self.model.plans(self.buckets, self.context, decode_attention)
        self._embed = weights.embed()
        self.ropes = {name: RopeTable(self.shapes.head_dim, params, rotary_dim=self.shapes.rotary_dim)
                      for name, params in self.model.rope_tables(cfg).items()}   # every RoPE table state
        self.stop_ids = frozenset(cfg.eos_ids) | frozenset(tokenizer.eos_ids)
        self.pad_id = min(self.stop_ids) if self.stop_ids else 0
        s = self.shapes
        self.host_attention = HostAttention(s.n_layers, s.n_heads, s.n_kv_heads, s.head_dim)
        self.pos = 0
        self.tokens: list[int] = []    # the ids whose K/V are in the cache (positions 0..pos-1)
        self.last_hidden: np.ndarray | None = None
        self.host_attn_s = 0.0          # CPU decode-attention time since the last reset
        head = self.plans[("head",)].steps[0].decl
        self._logit_names = [a.name for a in head.args if a.name.startswith("logits_")]
        self.kv_capacity = 0

    # ------------------------------------------------------------------------------------ loading
    @classmethod
    def load(cls, model: str | None = None, device: str = "auto", buckets: Sequence[int] = DEFAULT_BUCKETS,
             cache_dir: str | Path | None = None, progress: bool = True, warmup: bool = True,
             handoff: str = "device", context: int | None = None, decode_attention: str = "npu",
             weights_mode: str = "bf16") -> "Engine":
        """Resolve the model, validate it (config before any weight), choose the context (--context, else
        what the machine's memory allows) and check the whole memory plan before anything is allocated,
        build or reuse every kernel module, read all weights straight into their device buffers and
        (warmup) run one untimed prefill and decode step, so one-time device work stays out of the first
        timed request."""
        from multi_launch_builder.compile import build_modules
        from multi_launch_builder.executor import ModuleExecutor as KernelCache
        from multi_launch_builder.devices import make_device

        from .embedded import cache_root

        if handoff not in HANDOFFS:
            raise ValueError(f"handoff must be one of {HANDOFFS}, got {handoff!r}")
        model_dir = resolve_model(model, progress=progress)
        cfg = load_config(model_dir)
        tokenizer = Tokenizer(model_dir)
        dev = make_device(device)
        from .memory import available_bytes, choose_context
        from .models import model_for
        from .sizes import check_model_sizes, kernel_sizes, plan_modules

        check_model_sizes(cfg)      # every size the kernels constrain, before the checkpoint is opened
        avail = available_bytes() if getattr(dev, "name", "") in ("npu", "emu", "emu-interp") else None
        with kernel_sizes(cfg):     # the memory plan declares every module
            ctx = choose_context(cfg, select_buckets(buckets, cfg.max_position), context, avail, decode_attention)
        bs = select_buckets(buckets, ctx)
        model = model_for(cfg, weights_mode)
        from .embedded import gguf_source

        # headers + shapes checked; data is read straight into device buffers (q4: docs/quantization.md; the
        # weights decide whether a q4 run's LM head is 4-bit, so they are opened before the modules are planned)
        weights = ModelWeights(cfg, model, weights=weights_mode,
                               gguf=gguf_source(model_dir) if weights_mode == "q4" else None)
        decls = plan_modules(model, cfg, bs, ctx, decode_attention)   # every kernel planned (sizes past a budget)
        kind = getattr(dev, "name", "emu")
        cache_dir = Path(cache_dir) if cache_dir else cache_root() / "kernels"
        report = build_modules(decls, cache_dir, kind, progress=progress)
        cache = KernelCache(dev, report.artifacts, decls, handoff=handoff)
        eng = cls(cfg, tokenizer, weights, cache, bs, ctx, decode_attention)
        eng.preload(progress=progress)
        if warmup:
            eng.warmup()
        return eng

    def preload(self, progress: bool = True) -> None:
        """Write every static (each layer's weights once for all its modules, the LM head) before any timed
        call, each tensor read from the checkpoint straight into its device buffer."""
        from tqdm import tqdm

        c, w = self.cache, self.weights
        layer_plans = [plan for key, plan in self.plans.items() if key != ("head",)]
        for layer in tqdm(range(self.shapes.n_layers), desc="uploading weights", unit="layer",
                          disable=not progress, leave=False):
            decls = {d.name: d for plan in layer_plans for d in layer_plan(plan, layer).decls}
            for d in decls.values():
                c.write_static(d.name, bo_key=layer_key(layer),
                               **{a: w.writer(a, layer) for a in d.names(Role.STATIC)})
        head = self.plans[("head",)].steps[0].decl
        c.write_static(head.name, bo_key=head.name, **{a: w.writer(a, None) for a in head.names(Role.STATIC)})
        self._ensure_capacity(min(max(self.buckets), self.context))
        c.reset_counters()  # the profile counts inference traffic, not the one-time upload

    def warmup(self) -> None:
        """One untimed prefill (smallest bucket) + decode step + LM head; then a clean state."""
        self.prefill([self.pad_id])
        self.decode_step(self.pad_id)
        self.reset()
        self.host_attn_s = 0.0
        self.cache.reset_counters()

    # ------------------------------------------------------------------------------------ helpers
    def _check_ids(self, token_ids: Sequence[int]) -> list[int]:
        ids = [int(t) for t in token_ids]
        if not ids:
            raise PromptError("empty prompt: nothing to run")
        bad = [t for t in ids if not 0 <= t < self.shapes.vocab]
        if bad:
            raise PromptError(f"token id {bad[0]} is outside the vocabulary [0, {self.shapes.vocab})")
        return ids

    def _ensure_capacity(self, needed: int) -> None:
        """KV cache and RoPE table rows for positions [0, needed): grown (contents kept) by doubling, never
        beyond the run's context, never silently truncated."""
        if needed > self.context:
            raise PromptError(f"position {needed - 1} is beyond this run's context of {self.context} tokens"
                              + (" (--context)" if self.context < self.config.max_position else ""))
        if needed <= self.kv_capacity:
            return
        old = self.kv_capacity
        cap = min(w for w in self.windows if w >= needed)   # a window: every attention module fits the cache
        for name in (K_CACHE, V_CACHE):
            self.cache.define_state(name, cap)
        for name, table in self.ropes.items():
            self.cache.define_state(name, cap, per_key=False)
            self.cache.write_state(name, table.rows(cap)[old:], start=old)
        self.kv_capacity = cap

    def reset(self) -> None:
        """Forget the conversation: the next prefill starts at position 0."""
        self.pos = 0
        self.tokens = []
        self.last_hidden = None
        self.host_attention.reset()

    # ------------------------------------------------------------------------------------ the one walk
    def _run_layers(self, plan: PhasePlan, x: np.ndarray, pos: int, read_hidden: bool = False,
                    read_last: bool = False) -> list[np.ndarray]:
        return run_layers(self.cache, plan, x, pos, self.shapes.n_layers, self._host_op, read_hidden, read_last)

    def _host_op(self, step, layer: int, pos: int, results: dict) -> np.ndarray:
        op = step.host_op
        if op.kind != "attention":
            raise ValueError(f"no host implementation of op {op.kind!r}")
        (src,) = step.inputs.values()
        q = results[src.step][src.arg]
        t0 = time.perf_counter()
        out = self.host_attention.attend(self.cache, layer, pos, q, window=op.params.get("window"),
                                         scale_dim=op.params.get("scale_dim"))
        self.host_attn_s += time.perf_counter() - t0
        return out

    def _lm_head(self, module: str, arg: str, row: int | None) -> np.ndarray:
        """Final RMSNorm + LM head on the device, on `module.arg` (row `row`) -> f32 logits [vocab]."""
        head = self.plans[("head",)].steps[0].decl
        out = self.cache.load_and_run(head.name, bo_key=head.name, x=self.cache.ref(module, arg, row=row))
        logits = np.concatenate([out[n].reshape(-1) for n in self._logit_names])
        return self.model.final_logits(logits[: self.shapes.vocab].astype(np.float32))

    # ------------------------------------------------------------------------------------ prefill
    def chunks(self, total: int, start: int, bucket: int | None = None) -> list[tuple[int, int]]:
        """(position, rows) of the prefill chunks that compute positions [start, total).

        Full chunks of the largest bucket while that many remain; then, for the rest r: the smallest bucket
        >= r when it computes at most twice r rows (one more chunk, placed to END at `total`: it recomputes a
        few rows before the start, which gives the same K/V bytes), else a full chunk of the largest bucket
        <= r and again. Every chunk but a prompt shorter than its bucket is full: none needs rows past the
        prompt, so the cache never needs more rows than the context."""
        if bucket is not None:
            if bucket not in self.buckets or bucket < total - start or (start and bucket > total):
                raise PromptError(f"bucket {bucket} cannot hold positions [{start}, {total}) "
                                  f"(compiled: {list(self.buckets)})")
            return [(max(0, total - bucket), bucket)]
        out, p = [], start
        while p < total:
            rest = total - p
            up = min((b for b in self.buckets if b >= rest), default=None)
            down = max((b for b in self.buckets if b <= rest), default=None)
            if up is not None and (up <= 2 * rest or down is None):
                out.append((max(0, total - up), up))
                break
            out.append((p, down))
            p += down
        return out

    def _window(self, needed: int, rows: int | None = None) -> int:
        """The smallest KV window holding positions [0, needed) (a prefill chunk may also use its own size)."""
        return min(w for w in (*((rows,) if rows else ()), *self.windows) if w >= needed)

    def _prefill_from(self, ids: list[int], start: int, return_hidden: bool = False,
                      bucket: int | None = None) -> PrefillResult:
        """Compute positions [start, len(ids)) on top of the cache (positions < start hold ids[:start]) in
        bucket-sized chunks, each appending its K/V rows to the device cache; logits of the last token."""
        n = len(ids)
        plan_chunks = self.chunks(n, start, bucket)
        self._ensure_capacity(max(p + r for p, r in plan_chunks))
        hidden = [[] for _ in range(self.shapes.n_layers)] if return_hidden else None
        done = start
        for p, rows in plan_chunks:
            toks = np.full(rows, self.pad_id, dtype=np.int64)
            real = ids[p:p + rows]
            toks[:len(real)] = real
            x = self.model.embed_rows(np.asarray(self._embed[toks], dtype=BF16))   # [rows, H] gather on the host
            plan = self.plans[("prefill", rows, self._window(p + rows, rows))]
            outs = self._run_layers(plan, x, p, read_hidden=return_hidden)
            if return_hidden:
                new = slice(done - p, min(n, p + rows) - p)          # rows this chunk adds
                for layer, o in enumerate(outs):
                    hidden[layer].append(o.reshape(rows, -1)[new].astype(np.float32))
            done = min(n, p + rows)
        self.pos = n
        self.tokens = list(ids)
        last = layer_plan(plan, -1)
        out_step, out_arg = last.output
        logits = self._lm_head(last.steps[out_step].decl.name, out_arg, n - 1 - p)
        hidden = [np.concatenate(h) for h in hidden] if return_hidden else None
        self.last_hidden = to_bf16(hidden[-1][-1]) if return_hidden else None
        return PrefillResult(logits, hidden, self.last_hidden, n, rows)

    def prefill(self, token_ids: Sequence[int], return_hidden: bool = False,
                bucket: int | None = None) -> PrefillResult:
        """Run the prompt from position 0 (any length up to the context: bucket-sized chunks, or exactly one
        chunk of `bucket`); its K/V rows land in the device cache; returns the logits of the last token."""
        ids = self._check_ids(token_ids)
        self.reset()
        return self._prefill_from(ids, 0, return_hidden, bucket)

    # ------------------------------------------------------------------------------------ decode
    def decode_step(self, token_id: int) -> np.ndarray:
        """Feed one token at the current position; returns f32 logits [vocab] and advances. With NPU attention
        the whole layer is one dispatch (the token's K/V appended and attended on the device)."""
        if self.pos == 0:
            raise PromptError("decode_step before prefill: run a prompt first")
        self._check_ids([token_id])
        pos = self.pos
        self._ensure_capacity(pos + 1)
        x = self.model.embed_rows(np.asarray(self._embed[int(token_id)], dtype=BF16).reshape(1, self.shapes.hidden))
        key = ("decode", None) if self.decode_attention == "host" else ("decode", self._window(pos + 1))
        plan = self.plans[key]
        self._run_layers(plan, x, pos)
        self.pos = pos + 1
        self.tokens.append(int(token_id))
        last = layer_plan(plan, -1)
        out_step, out_arg = last.output
        return self._lm_head(last.steps[out_step].decl.name, out_arg, None)

    # ------------------------------------------------------------------------------------ generate
    def check_budget(self, n_prompt: int, max_new_tokens: int) -> None:
        what = "the model's context" if self.context == self.config.max_position else "this run's --context"
        check_budget(n_prompt, max_new_tokens, self.context, what)

    def reusable_prefix(self, token_ids: Sequence[int]) -> int:
        """How many leading tokens of `token_ids` already have their K/V in the cache: the common prefix with
        the cached tokens, at most all but the last token (its logits are computed). A chat turn appended to
        the conversation reuses the whole history; a repeated or edited prompt reuses what it shares."""
        limit = min(self.pos, len(token_ids) - 1)
        cached = self.tokens
        if limit > 0 and list(token_ids[:limit]) == cached[:limit]:
            return limit
        return next((i for i in range(limit) if token_ids[i] != cached[i]), max(limit, 0))

    def _truncate(self, keep: int) -> None:
        """Keep the cache's first `keep` positions; later rows are overwritten before anything reads them."""
        self.pos = keep
        self.tokens = self.tokens[:keep]
        self.last_hidden = None
        self.host_attention.truncate(keep)

    def generate(self, token_ids: Sequence[int], max_new_tokens: int, sampler: Sampler | None = None,
                 on_token: Callable[[int, str], None] | None = None,
                 on_logits: Callable[[int, np.ndarray], None] | None = None,
                 stop_event: threading.Event | None = None, reuse_kv: bool = False) -> GenerationResult:
        """Prefill `token_ids` and decode up to `max_new_tokens` (generate_step, timed). With reuse_kv (chat,
        serve), the prompt's prefix already in the KV cache is not computed again, only the rest (see
        reusable_prefix)."""
        info = StepInfo()
        stream = _TextStream(self.tokenizer, on_token)
        tokens: list[int] = []
        for tok, _ in self.generate_step(token_ids, max_new_tokens, sampler, on_logits=on_logits,
                                         stop_event=stop_event, reuse_kv=reuse_kv, info=info):
            tokens.append(tok)
            stream.push(tokens)
        t_end = time.perf_counter()
        ttft = info.t_first - info.t_start
        n_dec = len(tokens) - 1
        dec_s = t_end - info.t_first
        return GenerationResult(
            tokens=tokens, text=self.tokenizer.decode(tokens), ttft_s=ttft,
            prefill_tok_s=info.prompt_computed / ttft if ttft > 0 else float("inf"),
            decode_tok_s=n_dec / dec_s if n_dec and dec_s > 0 else 0.0,
            ms_per_token=1e3 * dec_s / n_dec if n_dec else 0.0,
            stop_reason=info.stop_reason, prompt_len=info.prompt_len, prompt_computed=info.prompt_computed)

    def generate_step(self, token_ids: Sequence[int], max_new_tokens: int, sampler: Sampler | None = None,
                      processors: Sequence[Callable[[list[int], np.ndarray], np.ndarray]] = (),
                      logprobs: bool = False, stop_event: threading.Event | None = None, reuse_kv: bool = False,
                      on_logits: Callable[[int, np.ndarray], None] | None = None,
                      info: "StepInfo | None" = None) -> Iterator[tuple[int, np.ndarray | None]]:
        """The generation loop as a generator (mlx-lm's shape): yields (token, logprobs) per generated token,
        logprobs = log-softmax of the logits after the `processors` (each `(tokens so far, logits) -> logits`:
        penalties, grammar masks) and before the sampler's temperature / top-p, or None unless asked. Ends
        after an end-of-turn token, `max_new_tokens`, or when `stop_event` is set (checked before each decode
        step, so a consumer may set it after a yield); `info` gets the prompt counts, times and stop reason."""
        ids = self._check_ids(token_ids)
        keep = self.reusable_prefix(ids) if reuse_kv else 0
        reuse = keep > 0
        self.check_budget(len(ids), max_new_tokens)
        sampler = sampler or Sampler()
        info = info if info is not None else StepInfo()
        info.t_start = time.perf_counter()
        if reuse:
            self._truncate(keep)
        n_fed = len(ids) - keep  # prompt tokens actually computed now
        info.prompt_len, info.prompt_computed = len(ids), n_fed
        self._ensure_capacity(len(ids) + max_new_tokens)   # the cache grows once, not token by token
        if reuse and n_fed <= DECODE_FEED_TOKENS:
            for t in ids[self.pos:]:
                logits = self.decode_step(t)
        elif reuse:
            logits = self._prefill_from(ids, self.pos).logits
        else:
            logits = self.prefill(ids).logits
        tokens: list[int] = []
        while True:
            if on_logits is not None:
                on_logits(len(tokens), logits)
            for proc in processors:
                logits = proc(tokens, logits)
            lp = log_softmax(logits) if logprobs else None
            tok = sampler(logits)
            tokens.append(tok)
            if len(tokens) == 1:
                info.t_first = time.perf_counter()
            info.stop_reason = "eos" if tok in self.stop_ids else "length"
            yield tok, lp
            if info.stop_reason == "eos" or len(tokens) >= max_new_tokens:
                return
            if stop_event is not None and stop_event.is_set():
                info.stop_reason = "interrupted"
                return
            logits = self.decode_step(tok)


@dataclass
class StepInfo:
    """What one generate_step run did (filled in as it goes)."""
    prompt_len: int = 0
    prompt_computed: int = 0             # prompt tokens computed (the rest came from the KV cache)
    t_start: float = 0.0
    t_first: float = 0.0                 # when the first token was sampled
    stop_reason: str = "length"          # "eos" | "length" | "interrupted"


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
