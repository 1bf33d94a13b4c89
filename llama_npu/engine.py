"""The runtime: prefill, decode and the generation loop, walking the model description's phase plans through
one ModuleExecutor (multi_launch_builder.executor). Loading (checkpoint -> weights -> built modules ->
executor) is llama_npu/loader.py; the device states are llama_npu/states.py; the walk that binds every module
input is llama_npu/walk.py; timing, text streaming and stop strings on top of generate_step are
llama_npu/generation.py.

Prefill runs a prompt in the smallest bucket that holds it (3 dispatches per layer: attention inputs with the
K/V append, attention, the rest); decode feeds one token through ONE fused module per layer (attention on the
NPU over the cache window), so a token is n_layers + 1 dispatches with the LM head (final RMSNorm +
vocabulary GEMVs); a greedy (or top-k sampled) token is ONE dispatch (llama_npu/token_decode.py: the whole
token in one module). With --decode-attention host, decode runs the attention-input and FFN modules with the CPU
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

from kernel_builder.numerics import BF16, to_bf16

from .config import ModelConfig, load_config, select_buckets  # noqa: F401 (re-exported)
from .errors import PromptError
from .generation import GenerationResult, StepInfo, generate  # noqa: F401 (re-exported)
from .host_attention import HostAttention
from .loader import HANDOFFS, load_engine, preload, warm_up  # noqa: F401 (HANDOFFS re-exported)
from .models.graph import HEAD_PLAN, PhasePlan, decode_plan, layer_plan, prefill_plan
from .processors import log_softmax
from .sampling import Sampler
from .states import DeviceStates
from .tokenizer import Tokenizer
from .walk import layer_key, run_layers  # noqa: F401 (re-exported)
from .models.token import token_module_name
from .token_decode import TokenDecoder, sample_logits
from kernel_builder.topk.external import TOPK_MAX_K
from .weights import ModelWeights

from .sizes import DEFAULT_BUCKETS  # noqa: E402,F401 (re-exported: the CLI, benchmarks and tests import it here)
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
        self.plans = self.model.plans(self.buckets, self.context, decode_attention)
        self._embed = weights.embed()
        self.states = DeviceStates(cache, self.model, cfg, self.context)   # KV cache, RoPE tables
        self.windows = self.states.windows        # KV-cache windows attention is built for
        self.stop_ids = frozenset(cfg.eos_ids) | frozenset(tokenizer.eos_ids)
        self.pad_id = min(self.stop_ids) if self.stop_ids else 0
        s = self.shapes
        self.host_attention = HostAttention(s.n_layers, s.n_heads, s.n_kv_heads, s.head_dim)
        self.pos = 0
        self.tokens: list[int] = []    # the ids whose K/V are in the cache (positions 0..pos-1)
        self.last_hidden: np.ndarray | None = None
        self.host_attn_s = 0.0          # CPU decode-attention time since the last reset
        head = self.plans[HEAD_PLAN].steps[0].decl
        self._logit_names = [a.name for a in head.args if a.name.startswith("logits_")]
        # greedy / top-k decode in one dispatch per token (llama_npu/token_decode.py), when the modules are declared
        tok = {w: cache.decls[n] for w in self.windows if (n := token_module_name(w)) in getattr(cache, "decls", {})}
        self.token_decode = TokenDecoder(cache, tok, self.shapes.vocab, model=self.model) if tok else None

    # ------------------------------------------------------------------------------------ loading
    @classmethod
    def load(cls, model: str | None = None, device: str = "auto", buckets: Sequence[int] = DEFAULT_BUCKETS,
             cache_dir: str | Path | None = None, progress: bool = True, warmup: bool = True,
             handoff: str = "device", context: int | None = None, decode_attention: str = "npu",
             weights_mode: str = "bf16", kv: str = "bf16") -> "Engine":
        """A ready Engine for `model` (loader.load_engine: validate, plan memory, build, upload, warm up)."""
        return load_engine(cls, model, device, buckets, cache_dir, progress, warmup, handoff, context,
                           decode_attention, weights_mode, kv)

    def preload(self, progress: bool = True) -> None:
        """Every static into its device buffer (loader.preload)."""
        preload(self, progress)

    def warmup(self) -> None:
        """One untimed prefill + decode step, then a clean state (loader.warm_up)."""
        warm_up(self)

    @property
    def kv_capacity(self) -> int:
        """Rows the device states hold now (a KV window)."""
        return self.states.capacity

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
        """KV cache and RoPE table rows for positions [0, needed) (states.DeviceStates.ensure)."""
        self.states.ensure(needed)

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
        head = self.plans[HEAD_PLAN].steps[0].decl
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
        return self.states.window(needed, rows)

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
            plan = self.plans[prefill_plan(rows, self._window(p + rows, rows))]
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
        plan = self.plans[decode_plan(None if self.decode_attention == "host" else self._window(pos + 1))]
        self._run_layers(plan, x, pos)
        self.pos = pos + 1
        self.tokens.append(int(token_id))
        last = layer_plan(plan, -1)
        out_step, out_arg = last.output
        return self._lm_head(last.steps[out_step].decl.name, out_arg, None)

    def decode_next(self, token_id: int, sampler: Sampler | None = None) -> int:
        """Feed one token at the current position and return the next id in ONE dispatch (llama_npu/token_decode.py):
        the argmax of the logits, or with a top-k `sampler` its draw from the k best; advances like decode_step."""
        if self.pos == 0:
            raise PromptError("decode_next before prefill: run a prompt first")
        self._check_ids([token_id])
        pos = self.pos
        self._ensure_capacity(pos + 1)
        if sampler is None or sampler.temperature <= 0:
            nxt = self.token_decode.step(token_id, pos, self._window(pos + 1))
        else:
            ids, vals = self.token_decode.candidates(token_id, pos, self._window(pos + 1), sampler.top_k)
            nxt = sampler(sample_logits(ids, vals, self.shapes.vocab))
        self.pos = pos + 1
        self.tokens.append(int(token_id))
        return nxt

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
        """Prefill `token_ids` and decode up to `max_new_tokens` (generate_step, timed: generation.generate).
        With reuse_kv (chat, serve), the prompt's prefix already in the KV cache is not computed again, only
        the rest (see reusable_prefix)."""
        return generate(self, token_ids, max_new_tokens, sampler, on_token, on_logits, stop_event, reuse_kv)

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
        one = (self.token_decode is not None and isinstance(sampler, Sampler) and not processors and not logprobs
               and on_logits is None and (sampler.temperature <= 0 or 0 < sampler.top_k <= TOPK_MAX_K))
        nxt = None
        while True:
            if nxt is not None:
                tok, lp = nxt, None
            else:
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
            if one:
                nxt = self.decode_next(tok, sampler)   # one dispatch: the argmax or the top-k on the device
            else:
                logits = self.decode_step(tok)
