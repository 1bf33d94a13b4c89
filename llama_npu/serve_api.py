"""The OpenAI wire format for `llama-npu serve`: request validation and the JSON shapes of responses,
stream chunks and errors. No HTTP here (server.py) and no engine (serve_worker.py).

Every problem with a request is an ApiError: an HTTP status plus OpenAI's error object
`{"error": {"message", "type", "param", "code"}}`.
"""
from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field

from .serve_options import Options, ToolError, message_extras, parse_options

# Roles the chat template is given; "developer" (OpenAI's newer name for system) is passed on as "system".
ROLES = ("system", "developer", "user", "assistant", "tool")
MAX_STOP_STRINGS = 4  # as the OpenAI API
SEED_LIMIT = 2**63    # seeds are in [0, 2**63): numpy's generator takes no negative seed


class ApiError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 type_: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.type = type_ or ("invalid_request_error" if status < 500 else "server_error")

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def bad(message: str, param: str | None = None, code: str | None = None) -> ApiError:
    return ApiError(400, message, param, code)


@dataclass
class GenRequest:
    """One validated generation request (chat or completion)."""
    kind: str                          # "chat" | "completion"
    model: str
    max_tokens: int | None             # None: the server default (capped at the context)
    temperature: float | None = None   # None: the server default (--temperature)
    top_p: float = 1.0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    stream: bool = False
    include_usage: bool = False        # stream_options.include_usage: a final chunk with `usage`
    messages: list[dict] | None = None  # chat: [{"role", "content": str}]
    prompt: str | list[int] | None = None  # completion: text, or token ids
    options: Options = field(default_factory=Options)  # tools, response_format, logprobs, penalties (serve_options)


# ------------------------------------------------------------------------------------------- parsing
def parse_json(raw: bytes) -> dict:
    try:
        body = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        msg = e.msg if isinstance(e, json.JSONDecodeError) else "not UTF-8"
        raise bad(f"the request body is not valid JSON ({msg})") from None
    except RecursionError:
        raise bad("the request body is nested too deeply") from None
    if not isinstance(body, dict):
        raise bad("the request body must be a JSON object")
    return body


def _number(body: dict, name: str, default: float | None, lo: float, hi: float, lo_open: bool = False) -> float | None:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise bad(f"'{name}' must be a number, got {json.dumps(value)}", name)
    if not (lo < value if lo_open else lo <= value) or value > hi:
        rng = f"({lo}, {hi}]" if lo_open else f"[{lo}, {hi}]"
        raise bad(f"'{name}' must be in {rng}, got {value}", name)
    return float(value)


def _int(body: dict, name: str) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise bad(f"'{name}' must be an integer, got {json.dumps(value)}", name)
    return value


def _seed(body: dict) -> int | None:
    value = _int(body, "seed")
    if value is not None and not 0 <= value < SEED_LIMIT:
        raise bad(f"'seed' must be an integer in [0, 2**63), got {value}", "seed")
    return value


def _stop(body: dict) -> list[str]:
    value = body.get("stop")
    if value is None:
        return []
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not all(isinstance(s, str) for s in items):
        raise bad("'stop' must be a string or a list of strings", "stop")
    if len(items) > MAX_STOP_STRINGS:
        raise bad(f"'stop' takes at most {MAX_STOP_STRINGS} strings, got {len(items)}", "stop")
    return [s for s in items if s]


def _common(body: dict, kind: str, served_model: str) -> GenRequest:
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise bad("'model' must be a string", "model")
    if model not in (None, "", served_model):
        raise ApiError(404, f"the model '{model}' does not exist; this server serves '{served_model}'",
                       "model", "model_not_found")
    n = _int(body, "n")
    if n is not None and n != 1:
        raise bad(f"only n=1 is supported, got n={n}", "n")
    max_tokens = None
    for name in ("max_completion_tokens", "max_tokens"):  # the newer name wins when both are given
        value = _int(body, name)
        if value is not None:
            if value <= 0:
                raise bad(f"'{name}' must be a positive integer, got {value}", name)
            max_tokens = value if max_tokens is None else max_tokens
    stream = body.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise bad("'stream' must be true or false", "stream")
    opts = body.get("stream_options") or {}
    if not isinstance(opts, dict):
        raise bad("'stream_options' must be an object", "stream_options")
    if not isinstance(opts.get("include_usage", False), (bool, type(None))):
        raise bad("'stream_options.include_usage' must be true or false", "stream_options.include_usage")
    return GenRequest(kind=kind, model=served_model, max_tokens=max_tokens,
                      temperature=_number(body, "temperature", None, 0.0, 2.0),
                      top_p=_number(body, "top_p", 1.0, 0.0, 1.0, lo_open=True),
                      seed=_seed(body), stop=_stop(body), stream=stream,
                      include_usage=bool(opts.get("include_usage", False)))


def _content(value, where: str) -> str:
    """A message's content: a string, or a list of text parts (other part types are not supported)."""
    if isinstance(value, str):
        return value
    if value is None:
        return ""
    if isinstance(value, list):
        texts = []
        for i, part in enumerate(value):
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise bad(f"{where}[{i}]: only text content parts are supported, got {kind!r}", where)
            texts.append(part["text"])
        return "".join(texts)
    raise bad(f"{where} must be a string or a list of text parts", where)


def _checked(parse, *args):
    try:
        return parse(*args)
    except ToolError as e:  # tools, response_format, logprobs, penalties (serve_options)
        raise bad(str(e), e.param) from None


def parse_chat(body: dict, served_model: str) -> GenRequest:
    req = _common(body, "chat", served_model)
    messages = body.get("messages")
    if messages is None:
        raise bad("'messages' is required", "messages")
    if not isinstance(messages, list) or not messages:
        raise bad("'messages' must be a non-empty list of messages", "messages")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise bad(f"messages[{i}] must be an object with 'role' and 'content'", f"messages[{i}]")
        role = m.get("role")
        if role not in ROLES:
            raise bad(f"messages[{i}].role: unknown role {json.dumps(role)}; expected one of {', '.join(ROLES)}",
                      f"messages[{i}].role")
        text = _content(m.get("content"), f"messages[{i}].content")
        out.append({"role": "system" if role == "developer" else role, "content": text,
                    **_checked(message_extras, m, i)})
    req.messages = out
    req.options = _checked(parse_options, body, "chat")
    return req


def parse_completion(body: dict, served_model: str) -> GenRequest:
    req = _common(body, "completion", served_model)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one
    if prompt is None:
        raise bad("'prompt' is required", "prompt")
    if isinstance(prompt, list):
        if not prompt or not all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            raise bad("'prompt' must be a string, or one list of token ids (batches are not supported)", "prompt")
    elif not isinstance(prompt, str):
        raise bad("'prompt' must be a string", "prompt")
    if prompt == "":
        raise bad("'prompt' is empty", "prompt")
    if body.get("echo"):
        raise bad("'echo' is not supported", "echo")
    req.prompt = prompt
    req.options = _checked(parse_options, body, "completion")
    return req


# ------------------------------------------------------------------------------------------- responses
def new_id(kind: str) -> str:
    return ("chatcmpl-" if kind == "chat" else "cmpl-") + uuid.uuid4().hex[:24]


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> dict:
    """completion_tokens counts every generated token, the end-of-turn token included; cached_tokens: prompt
    tokens whose K/V the previous request left in the cache (not computed again)."""
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": cached_tokens}}


def model_card(model: str, created: int) -> dict:
    return {"id": model, "object": "model", "created": created, "owned_by": "llama-npu"}


def response(req: GenRequest, rid: str, text: str, finish: str, u: dict, tool_calls: list | None = None,
             logprobs: list | None = None) -> dict:
    created = int(time.time())
    lp = _logprobs(req, logprobs)
    if req.kind == "chat":
        message = {"role": "assistant", "content": text if text or not tool_calls else None}
        if tool_calls:
            message["tool_calls"] = tool_calls
        choice = {"index": 0, "message": message, "logprobs": lp, "finish_reason": finish}
        obj = "chat.completion"
    else:
        choice = {"index": 0, "text": text, "logprobs": lp, "finish_reason": finish}
        obj = "text_completion"
    return {"id": rid, "object": obj, "created": created, "model": req.model, "choices": [choice], "usage": u}


def _logprobs(req: GenRequest, entries: list | None) -> dict | None:
    """Chat: {"content": [{token, logprob, bytes, top_logprobs}]}; completions: the legacy columns."""
    if not req.options.logprobs or entries is None:
        return None
    if req.kind == "chat":
        return {"content": entries, "refusal": None}
    offsets, pos = [], 0
    for e in entries:
        offsets.append(pos)
        pos += len(e["token"])
    return {"tokens": [e["token"] for e in entries], "token_logprobs": [e["logprob"] for e in entries],
            "top_logprobs": [{t["token"]: t["logprob"] for t in e["top_logprobs"]} for e in entries],
            "text_offset": offsets}


def chunk(req: GenRequest, rid: str, created: int, text: str | None = None, finish: str | None = None,
          role: bool = False, u: dict | None = None, delta: dict | None = None) -> dict:
    """One stream event. Chat: `delta` with the role (first chunk), content or tool_calls; completion: `text`.
    `delta` (from the engine thread): {"content"?, "tool_calls"?, "logprobs"?}. `u` given: the usage-only
    final chunk (empty `choices`)."""
    extra = dict(delta or {})
    lp = _logprobs(req, extra.pop("logprobs", None))
    text = extra.pop("content", text)
    if req.kind == "chat":
        obj = "chat.completion.chunk"
        d: dict = {"role": "assistant", "content": ""} if role else {}
        if text:
            d["content"] = text
        d.update(extra)
        choice = {"index": 0, "delta": d, "logprobs": lp, "finish_reason": finish}
    else:
        obj = "text_completion"
        choice = {"index": 0, "text": text or "", "logprobs": lp, "finish_reason": finish}
    out = {"id": rid, "object": obj, "created": created, "model": req.model,
           "choices": [] if u is not None else [choice]}
    if u is not None or req.include_usage:
        out["usage"] = u  # null on the other chunks when include_usage is asked, as the OpenAI API
    return out


def sse(data: dict | str) -> str:
    """One server-sent event carrying a JSON object (or the literal [DONE])."""
    return f"data: {data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)}\n\n"
