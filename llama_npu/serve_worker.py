"""The engine side of `llama-npu serve`: one Engine, requests served one at a time in arrival order (the
device is one resource) by the thread that loaded the engine, stop strings held back across text deltas
(generation.StopStrings).

The engine runs on the thread that loaded it (the main thread; HTTP runs on another): with the emulator,
generation on a different thread than the load was 3-5x slower (emu sets OpenBLAS's thread count around
every dispatch; see docs/serve.md).

Uses the Engine's check_budget, reset, tokenizer and config; a generation itself (generate_step with reuse_kv,
the request's processors, stop strings, tool calls, logprobs) is serve_gen.generate.
"""
from __future__ import annotations

import queue
import threading
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Callable

from .errors import LlamaNpuError, PromptError
from .generation import StopStrings
from . import serve_gen
from .sampling import Sampler
from .serve_api import ApiError, GenRequest, bad
from .serve_limits import least_tokens, max_token_bytes


@dataclass(eq=False)  # hashed by identity (kept in a set)
class Job:
    """A validated request turned into token ids, waiting for (or being served by) the engine."""
    req: GenRequest
    ids: list[int]
    max_tokens: int
    stop: threading.Event = field(default_factory=threading.Event)  # set: client gone / stop string / shutdown
    sampler: Sampler | None = None     # built (and so checked) by prepare()
    plan: object = None           # serve_gen.Plan: grammar constraint, tool-call syntax


@dataclass
class Outcome:
    text: str
    finish_reason: str            # "stop" | "length" | "interrupted" (client gone or server shutting down;
                                  # the client sees "length": server._finish)
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0        # prompt tokens whose K/V were already in the cache (not computed again)
    tool_calls: list | None = None  # OpenAI tool_calls (finish_reason "tool_calls")
    logprobs: list | None = None    # chat-format logprob entries, one per generated token (logprobs asked)


class EngineWorker:
    def __init__(self, engine, model_id: str, default_max_tokens: int = 1024, default_temperature: float = 1.0):
        self.engine = engine
        self.model_id = model_id
        self.default_max_tokens = default_max_tokens
        self.default_temperature = default_temperature
        self.context = engine.context  # this run's context (--context, or what memory allows), not the model's
        self.whose = "this model's" if self.context == engine.config.max_position else "this server's"
        self.token_bytes = max_token_bytes(engine.tokenizer)
        self._queue: queue.Queue = queue.Queue()  # (job, emit, future), first come first served
        self._lock = threading.Lock()
        self._jobs: set[Job] = set()   # queued or running
        # totals since start, shown by GET /health
        self.stats = {"served": 0, "interrupted": 0, "prompt_tokens": 0, "cached_tokens": 0,
                      "completion_tokens": 0}

    # --------------------------------------------------------------------------- request -> job
    def prepare(self, req: GenRequest) -> Job:
        """Token ids and the token budget, checked against the context before the job is queued
        (cheap: tokenizer only), so a bad request never waits behind others."""
        tok = self.engine.tokenizer
        param = "messages" if req.kind == "chat" else "prompt"
        texts = [m["content"] for m in req.messages] if req.kind == "chat" else [req.prompt]
        least = least_tokens([t for t in texts if isinstance(t, str)], self.token_bytes)
        if least > self.context:  # megabytes of text: refused in microseconds, not after seconds of tokenizing
            raise ApiError(400, f"{self.whose} context is {self.context} tokens; the prompt has at least {least} "
                                "tokens", param, "context_length_exceeded")
        try:
            # a conversation with tools is rendered there; the grammar is compiled (a bad schema: 400 now)
            ids, plan = serve_gen.prepare(self.engine, req)
            if ids is not None:
                ids = list(ids)
            elif req.kind == "chat":
                ids = tok.apply_chat_template(req.messages)
            elif isinstance(req.prompt, list):
                vocab = self.engine.config.shapes.vocab
                wrong = [t for t in req.prompt if not 0 <= t < vocab]
                if wrong:
                    raise bad(f"token id {wrong[0]} is outside the vocabulary [0, {vocab})", "prompt")
                ids = list(req.prompt)
            else:
                ids = tok.encode(req.prompt, add_special_tokens=True)
        except LlamaNpuError as e:  # e.g. the chat template rejects the conversation (roles must alternate)
            raise bad(str(e), param) from None
        except (UnicodeError, ValueError, TypeError) as e:  # e.g. a lone surrogate the tokenizer cannot take
            raise bad(f"the {param} cannot be tokenized: {type(e).__name__}: {str(e).splitlines()[0][:200]}",
                      param) from None
        if not ids:
            raise bad("the prompt is empty after tokenization", param)
        room = self.context - len(ids)
        max_tokens = req.max_tokens if req.max_tokens is not None else min(self.default_max_tokens, room)
        try:
            self.engine.check_budget(len(ids), max(max_tokens, 1))
        except PromptError:
            asked = f"{max_tokens} completion tokens" if req.max_tokens is not None else "at least 1 token"
            raise ApiError(400, f"{self.whose} context is {self.context} tokens; the prompt has {len(ids)} "
                                f"tokens and {asked} were requested ({len(ids) + max(max_tokens, 1)} in all)",
                           "max_tokens" if req.max_tokens is not None and room > 0 else param,
                           "context_length_exceeded") from None
        temperature = self.default_temperature if req.temperature is None else req.temperature
        try:
            sampler = Sampler(temperature=temperature, top_p=req.top_p, seed=req.seed)
        except ValueError as e:  # checked here, on the request's thread: the engine never sees a bad request
            raise bad(str(e)) from None
        return Job(req, ids, max_tokens, sampler=sampler, plan=plan)

    # --------------------------------------------------------------------------- queue
    def submit(self, job: Job, emit: Callable[[dict], None] | None = None) -> Future:
        """Queue `job` (from any thread); the returned future gives its Outcome. `emit(delta)` is called
        from the engine thread with each piece of the reply as it is generated: {"content"?: text,
        "tool_calls"?: [OpenAI tool-call deltas], "logprobs"?: [entries]}."""
        fut: Future = Future()
        with self._lock:
            self._jobs.add(job)
        self._queue.put((job, emit, fut))
        return fut

    def serve_forever(self, done: Callable[[], bool], poll_s: float = 0.1) -> None:
        """Run queued jobs one at a time until done() is true. Call from the thread that loaded the engine."""
        while not done():
            try:
                job, emit, fut = self._queue.get(timeout=poll_s)
            except queue.Empty:
                continue
            if not fut.set_running_or_notify_cancel():
                continue
            try:
                fut.set_result(self._serve(job, emit))
            except BaseException as e:  # the request gets the error; Ctrl-C still ends the server
                fut.set_exception(e)
                if not isinstance(e, Exception):
                    raise

    def health(self) -> dict:
        with self._lock:
            return {"pending": len(self._jobs), **self.stats}

    def stop_all(self) -> None:
        """Shutdown: every queued or running job stops after its current token."""
        with self._lock:
            for job in self._jobs:
                job.stop.set()

    def close(self) -> None:
        """Shutdown: jobs still queued end without touching the engine (their streams finish)."""
        self.stop_all()
        while True:
            try:
                job, _emit, fut = self._queue.get_nowait()
            except queue.Empty:
                return
            if fut.set_running_or_notify_cancel():
                fut.set_result(Outcome("", "interrupted", len(job.ids), 0))
            with self._lock:
                self._jobs.discard(job)

    # --------------------------------------------------------------------------- engine thread
    def _serve(self, job: Job, emit: Callable[[dict], None] | None) -> Outcome:
        out = None
        try:
            if job.stop.is_set():  # the client left while the job was queued: the engine is not touched
                out = Outcome("", "interrupted", len(job.ids), 0)
            else:
                out = self._generate(job, emit)
            return out
        finally:
            with self._lock:
                self._jobs.discard(job)
                st = self.stats
                st["served"] += 1
                if out is not None:
                    st["interrupted"] += out.finish_reason == "interrupted"
                    st["prompt_tokens"] += out.prompt_tokens
                    st["cached_tokens"] += out.cached_tokens
                    st["completion_tokens"] += out.completion_tokens

    def _generate(self, job: Job, emit: Callable[[dict], None] | None) -> Outcome:
        # generate_step with the request's processors, stop strings, tool calls, logprobs (serve_gen)
        r = serve_gen.generate(self.engine, job, emit, self.default_temperature, StopStrings(job.req.stop))
        cached = min(max(len(job.ids) - r.prompt_computed, 0), len(job.ids))
        return Outcome(r.text, r.finish_reason, len(job.ids), r.completion_tokens, cached,
                       tool_calls=r.tool_calls, logprobs=r.logprobs)
