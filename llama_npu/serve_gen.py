"""One `serve` generation on the engine thread: Engine.generate_step with the request's logits processors
(penalties, logit_bias, the grammar constraint last), stop strings, tool-call parsing and logprobs; the
client gets deltas `{"content"?, "tool_calls"?, "logprobs"?}` through `emit` as they are produced.

Also the per-request preparation that needs the engine's tokenizer: the prompt with its tools, and the
grammar constraint (compiled before the job is queued, so a bad schema is a 400 at once).
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Callable

from .constrained import GrammarEngine, GrammarError, Triggered, check_schema
from .generation import StepInfo, TextStream
from .processors import LogitBias, Penalties, top_k
from .sampling import Sampler
from .tool_calls import ToolSyntax, auto_grammar, auto_trigger, forced_grammar, render, syntax_for
from .tool_stream import ToolCallStream


@dataclass
class Plan:
    """What a request needs beyond its ids: the constraint and how to read tool calls from the reply."""
    constraint: object | None = None
    lazy: object | None = None           # tool_choice "auto": constrained.Triggered (the call grammar once opened)
    syntax: ToolSyntax | None = None     # set: the reply may hold tool calls
    tool_names: tuple[str, ...] = ()


_grammar_lock = threading.Lock()


def grammar_engine(engine) -> GrammarEngine:
    """The engine's llguidance tokenizer, built on first use (~1 s) and kept."""
    with _grammar_lock:
        ge = getattr(engine, "_grammar_engine", None)
        if ge is None:
            ge = GrammarEngine.for_tokenizer(engine.tokenizer, engine.stop_ids, engine.config.shapes.vocab)
            engine._grammar_engine = ge
        return ge


def prepare(engine, req) -> tuple[list[int] | None, Plan]:
    """(prompt ids when tools change the rendering, else None; the plan). Raises ApiError (400)."""
    from .serve_api import bad

    opts, vocab = req.options, engine.config.shapes.vocab
    wrong = [t for t in opts.logit_bias if not 0 <= t < vocab]
    if wrong:
        raise bad(f"'logit_bias': token id {wrong[0]} is outside the vocabulary [0, {vocab})", "logit_bias")
    plan, ids = Plan(), None
    spec = opts.tools
    for i, t in enumerate(spec.tools if spec is not None else ()):
        params = t["function"].get("parameters")
        if params is not None:
            try:
                check_schema(params, f"tools[{i}].function.parameters")
            except GrammarError as e:
                raise bad(str(e), f"tools[{i}].function.parameters") from None
    has_tool_msgs = req.kind == "chat" and any(m["role"] == "tool" or m.get("tool_calls") for m in req.messages)
    if spec is not None or has_tool_msgs:
        ids = render(engine.tokenizer, req.messages, spec)
    try:
        if opts.response_format is not None:
            rf = opts.response_format
            ge = grammar_engine(engine)
            plan.constraint = (ge.json_object() if rf["type"] == "json_object"
                               else ge.json_schema(rf["schema"], "response_format.json_schema.schema"))
        if spec is not None and spec.choice != "none":
            plan.syntax, plan.tool_names = syntax_for(engine.tokenizer), tuple(spec.names)
            ge, tok = grammar_engine(engine), engine.tokenizer
            if spec.choice in ("required", "named"):
                plan.constraint = ge.lark(forced_grammar(plan.syntax, spec), "a tool's parameters")
            elif auto_trigger(plan.syntax) and opts.response_format is None:
                lark = auto_grammar(plan.syntax, spec)
                ge.lark(lark, "a tool's parameters")  # compiles now: a bad schema is a 400 before queueing
                plan.lazy = Triggered(lambda: ge.lark(lark), auto_trigger(plan.syntax), tok.decode,
                                      lambda text: tok.encode(text, add_special_tokens=False))
    except GrammarError as e:
        param = "response_format" if opts.response_format is not None else "tools"
        raise bad(str(e), param) from None
    return ids, plan


def _entry(engine, tok: int, lp, k: int) -> dict:
    ge = grammar_engine(engine)

    def one(t: int, v: float) -> dict:
        text = engine.tokenizer.decode([t], skip_special_tokens=False)
        raw = text.encode() if t in engine.stop_ids else ge.token_bytes(t)
        return {"token": text, "logprob": v, "bytes": list(raw)}

    e = one(tok, float(lp[tok]))
    e["top_logprobs"] = [one(t, v) for t, v in top_k(lp, k)]
    return e


def _processors(plan: Plan, opts, vocab: int) -> list:
    procs: list = []
    if opts.presence_penalty or opts.frequency_penalty:
        procs.append(Penalties(vocab, opts.presence_penalty, opts.frequency_penalty))
    if opts.logit_bias:
        procs.append(LogitBias(vocab, opts.logit_bias))
    if plan.constraint is not None or plan.lazy is not None:
        # last: nothing after it can make a forbidden token possible
        procs.append(plan.constraint if plan.constraint is not None else plan.lazy)
    return procs


@dataclass
class Result:
    text: str                     # the content the client got
    finish_reason: str            # "stop" | "length" | "tool_calls" | "interrupted"
    completion_tokens: int
    prompt_computed: int          # prompt tokens computed (the rest came from the KV cache)
    tool_calls: list | None
    logprobs: list | None


def generate(engine, job, emit: Callable | None, default_temperature: float, stops) -> Result:
    """Run `job` (serve_worker.Job) to its end; `stops`: its generation.StopStrings."""
    req, plan, opts = job.req, job.plan or Plan(), job.req.options
    vocab = engine.config.shapes.vocab
    sampler = job.sampler or Sampler(temperature=default_temperature if req.temperature is None
                                     else req.temperature, top_p=req.top_p, seed=req.seed)  # built by prepare()
    procs = _processors(plan, opts, vocab)
    calls = ToolCallStream(plan.syntax, list(plan.tool_names), plan.constraint is not None) if plan.syntax else None
    content: list[str] = []
    pending: list[dict] = []   # logprob entries not yet sent
    every: list[dict] = []

    def send(events: list[tuple]) -> None:
        for ev in events:
            delta: dict = {}
            if ev[0] == "content":
                if not ev[1]:
                    continue
                content.append(ev[1])
                delta["content"] = ev[1]
            elif ev[0] == "call":
                delta["tool_calls"] = [{"index": ev[1], "id": ev[2], "type": "function",
                                        "function": {"name": ev[3], "arguments": ""}}]
            else:
                delta["tool_calls"] = [{"index": ev[1], "function": {"arguments": ev[2]}}]
            if pending:
                delta["logprobs"] = pending[:]
                pending.clear()
            if emit is not None:
                emit(delta)

    def text_out(text: str) -> None:
        if text:
            send(calls.push(text) if calls is not None else [("content", text)])

    deltas: list[str] = []
    stream = TextStream(engine.tokenizer, lambda _t, d: deltas.append(d))
    tokens: list[int] = []
    info = StepInfo()
    raw: list[str] = []
    try:
        # reuse_kv: the prompt's prefix already in the KV cache (the conversation so far, or the same prompt
        # again) is not computed again
        for tok, lp in engine.generate_step(job.ids, job.max_tokens, sampler, procs, logprobs=opts.logprobs,
                                            stop_event=job.stop, reuse_kv=True, info=info):
            tokens.append(tok)
            if opts.logprobs and tok not in engine.stop_ids:
                entry = _entry(engine, tok, lp, opts.top_logprobs)
                pending.append(entry)
                every.append(entry)
            stream.push(tokens)
            delta = deltas.pop() if deltas else ""
            if delta and not stops.hit:
                raw.append(delta)
                text_out(stops.push(delta))
                if stops.hit:
                    job.stop.set()  # generate_step ends before the next decode step
    except BaseException:
        engine.reset()  # a failure mid-run leaves no half-written conversation behind
        raise
    if not stops.hit:
        streamed, full = "".join(raw), engine.tokenizer.decode(tokens)
        if full.startswith(streamed):  # e.g. a trailing incomplete UTF-8 sequence never streamed
            text_out(stops.push(full[len(streamed):]))
        text_out(stops.flush())
    if calls is not None:
        send(calls.finish())
    if pending and emit is not None:
        emit({"logprobs": pending[:]})
    finish = "stop" if stops.hit or info.stop_reason == "eos" else info.stop_reason  # "length" | "interrupted"
    tool_calls = [{"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}}
                  for c in (calls.calls if calls is not None else [])]
    if tool_calls and finish == "stop":
        finish = "tool_calls"
    return Result("".join(content), finish, len(tokens), info.prompt_computed, tool_calls or None,
                  every if opts.logprobs else None)
