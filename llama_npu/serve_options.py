"""The request fields beyond plain generation, checked (a bad one raises ToolError(message, param), which
serve_api turns into a 400 naming it): tools / tool_choice /
parallel_tool_calls, response_format, logprobs / top_logprobs, presence / frequency penalty, logit_bias.
What each does: docs/serve.md, "Request fields"."""
from __future__ import annotations

import json
from dataclasses import dataclass, field

from .tool_calls import ToolError, ToolSpec, parse_message, parse_tools

MAX_TOP_LOGPROBS = 20  # chat (the completions endpoint: 5), as the OpenAI API


@dataclass
class Options:
    tools: ToolSpec | None = None
    response_format: dict | None = None     # None (text) | {"type": "json_object"} | {"type": "json_schema", ...}
    logprobs: bool = False
    top_logprobs: int = 0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[int, float] = field(default_factory=dict)

    @property
    def constrained(self) -> bool:
        return self.response_format is not None or (
            self.tools is not None and self.tools.choice in ("required", "named"))


def _bad(message: str, param: str) -> ToolError:
    return ToolError(message, param)  # serve_api turns it into a 400 naming `param`


def _float(body: dict, name: str, lo: float, hi: float) -> float:
    v = body.get(name)
    if v is None:
        return 0.0
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not lo <= v <= hi:
        raise _bad(f"'{name}' must be a number in [{lo}, {hi}], got {json.dumps(v)}", name)
    return float(v)


def _logit_bias(body: dict) -> dict[int, float]:
    """Token ids (their range is checked against the vocabulary when the job is prepared) and biases."""
    raw = body.get("logit_bias")
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise _bad("'logit_bias' must be an object {token id: bias}", "logit_bias")
    out = {}
    for k, v in raw.items():
        try:
            t = int(k)
        except (TypeError, ValueError):
            raise _bad(f"'logit_bias' keys must be token ids, got {json.dumps(k)}", "logit_bias") from None
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not -100 <= v <= 100:
            raise _bad(f"'logit_bias' values must be numbers in [-100, 100], got {json.dumps(v)}", "logit_bias")
        out[t] = float(v)
    return out


def _response_format(body: dict) -> dict | None:
    rf = body.get("response_format")
    if rf is None:
        return None
    kind = rf.get("type") if isinstance(rf, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "json_object"}
    if kind == "json_schema":
        js = rf.get("json_schema")
        if not isinstance(js, dict) or not isinstance(js.get("schema"), dict):
            raise _bad("response_format json_schema needs 'json_schema': {\"name\", \"schema\": {...}}",
                       "response_format.json_schema")
        return {"type": "json_schema", "schema": js["schema"], "name": js.get("name")}
    raise _bad("'response_format.type' must be \"text\", \"json_object\" or \"json_schema\", got "
               f"{json.dumps(kind)}", "response_format")


def _logprobs(body: dict, kind: str) -> tuple[bool, int]:
    lp, top = body.get("logprobs"), body.get("top_logprobs")
    if kind == "completion":  # the legacy field: logprobs = how many alternatives (0-5)
        if lp is None or lp is False:
            return False, 0
        if isinstance(lp, bool) or not isinstance(lp, int) or not 0 <= lp <= 5:
            raise _bad(f"'logprobs' must be an integer in [0, 5], got {json.dumps(lp)}", "logprobs")
        return True, lp
    if lp is not None and not isinstance(lp, bool):
        raise _bad("'logprobs' must be true or false", "logprobs")
    if top is not None:
        if isinstance(top, bool) or not isinstance(top, int) or not 0 <= top <= MAX_TOP_LOGPROBS:
            raise _bad(f"'top_logprobs' must be an integer in [0, {MAX_TOP_LOGPROBS}], got {json.dumps(top)}",
                       "top_logprobs")
        if not lp:
            raise _bad("'top_logprobs' needs 'logprobs': true", "top_logprobs")
    return bool(lp), top or 0


def parse_options(body: dict, kind: str) -> Options:
    lp, top = _logprobs(body, kind)
    opts = Options(logprobs=lp, top_logprobs=top,
                   presence_penalty=_float(body, "presence_penalty", -2.0, 2.0),
                   frequency_penalty=_float(body, "frequency_penalty", -2.0, 2.0),
                   logit_bias=_logit_bias(body))
    if kind == "chat":
        opts.tools = parse_tools(body)
        opts.response_format = _response_format(body)
        if opts.response_format is not None and opts.tools is not None and opts.tools.choice in ("required", "named"):
            raise _bad("'response_format' and a forced 'tool_choice' cannot both constrain the reply",
                       "response_format")
    else:
        for name in ("tools", "tool_choice", "response_format"):
            if body.get(name) is not None:
                raise _bad(f"'{name}' is a chat completions field (POST /v1/chat/completions)", name)
    return opts


def message_extras(m: dict, i: int) -> dict:
    """A chat message's tool fields (tool_call_id, tool_calls), checked."""
    return parse_message(m, i)
