"""Tool calling: the request's `tools` / `tool_choice` checked, tools rendered into the prompt, the model's
call syntax turned into OpenAI `tool_calls` (streamed as deltas), and the grammar that forces a call.

The call syntax comes from a table keyed by the chat template (one entry per syntax, not per model):
Hermes / Qwen `<tool_call>{json}</tool_call>` tags, and Llama 3.x bare JSON calls
(`{"name": ..., "parameters": ...}`). A template that renders `tools` itself is given them (and `tool`
messages, assistant `tool_calls`) as transformers does; one that ignores them (the embedded SmolLM2's)
gets the generic rendering: a system-prompt block listing the tools in Hermes style, assistant calls
written back as `<tool_call>` text, tool results as a user turn of `<tool_response>` blocks.
"""
from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass

from .constrained import lark_string, schema_lark

NAME_RE = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
NO_ARGS = {"type": "object", "properties": {}, "additionalProperties": False}


@dataclass(frozen=True)
class ToolSyntax:
    name: str
    markers: tuple[str, ...]   # a template containing one of these uses this syntax
    start: str                 # the text that opens a call ("" = the reply is the JSON call)
    end: str                   # the text that closes a call
    args_key: str              # where the arguments object is: "arguments" | "parameters"
    parallel: bool             # several calls in one reply
    separator: str = "\n"      # between calls


SYNTAXES = (
    ToolSyntax("hermes", ("<tool_call>",), "<tool_call>\n", "\n</tool_call>", "arguments", True),
    ToolSyntax("llama3_json", ('"parameters": dictionary', "<|python_tag|>"), "", "", "parameters", False),
)
GENERIC = SYNTAXES[0]

GENERIC_BLOCK = (
    "You may call one or more functions to assist with the user query. The functions, as JSON schemas:\n"
    "<tools>\n{tools}\n</tools>\n"
    "For each function call, answer with a JSON object with the function's name and arguments inside "
    "<tool_call></tool_call> tags:\n<tool_call>\n{{\"name\": <function-name>, \"arguments\": <args-json-object>}}\n"
    "</tool_call>")


class ToolError(ValueError):
    """A malformed request field (the message names it; `param` is its path): serve_api makes it a 400."""

    def __init__(self, message: str, param: str):
        super().__init__(message)
        self.param = param


@dataclass
class ToolSpec:
    tools: list[dict]                    # [{"type": "function", "function": {name, description?, parameters?}}]
    choice: str                          # "none" | "auto" | "required" | "named"
    named: str | None = None
    parallel: bool = True

    @property
    def names(self) -> list[str]:
        return [t["function"]["name"] for t in self.tools]

    def schema(self, name: str) -> dict:
        f = next(t["function"] for t in self.tools if t["function"]["name"] == name)
        return f.get("parameters") or NO_ARGS


def parse_tools(body: dict) -> ToolSpec | None:
    """The request's tools, tool_choice and parallel_tool_calls (ToolError on a malformed one)."""
    tools, choice = body.get("tools"), body.get("tool_choice")
    if tools is None:
        if choice not in (None, "none", "auto"):
            raise ToolError("'tool_choice' needs 'tools'", "tool_choice")
        return None
    if not isinstance(tools, list):
        raise ToolError("'tools' must be a list of {\"type\": \"function\", \"function\": {...}}", "tools")
    seen = set()
    for i, t in enumerate(tools):
        where = f"tools[{i}]"
        if not isinstance(t, dict) or t.get("type") != "function" or not isinstance(t.get("function"), dict):
            raise ToolError(f"{where} must be {{\"type\": \"function\", \"function\": {{...}}}}", where)
        f = t["function"]
        if not isinstance(f.get("name"), str) or not NAME_RE.match(f["name"]):
            raise ToolError(f"{where}.function.name must be 1-64 letters, digits, '_' or '-', "
                            f"got {json.dumps(f.get('name'))}", f"{where}.function.name")
        if f["name"] in seen:
            raise ToolError(f"{where}: a second tool named {f['name']!r}", f"{where}.function.name")
        seen.add(f["name"])
        params = f.get("parameters")
        if params is not None and (not isinstance(params, dict) or params.get("type", "object") != "object"):
            raise ToolError(f"{where}.function.parameters must be a JSON schema of type object",
                            f"{where}.function.parameters")
        if f.get("description") is not None and not isinstance(f["description"], str):
            raise ToolError(f"{where}.function.description must be a string", f"{where}.function.description")
    parallel = body.get("parallel_tool_calls", True)
    if not isinstance(parallel, bool):
        raise ToolError("'parallel_tool_calls' must be true or false", "parallel_tool_calls")
    spec = ToolSpec(tools, "auto" if tools else "none", parallel=parallel)
    if isinstance(choice, str) and choice in ("none", "auto", "required"):
        spec.choice = choice
    elif isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("function"), dict):
        name = choice["function"].get("name")
        if name not in seen:
            raise ToolError(f"tool_choice names the function {json.dumps(name)}, which is not in 'tools' "
                            f"({', '.join(sorted(seen)) or 'none'})", "tool_choice")
        spec.choice, spec.named = "named", name
    elif choice is not None:
        raise ToolError("'tool_choice' must be \"none\", \"auto\", \"required\" or "
                        "{\"type\": \"function\", \"function\": {\"name\": ...}}", "tool_choice")
    if spec.choice in ("required", "named") and not tools:
        raise ToolError(f"tool_choice {spec.choice!r} with an empty 'tools' list", "tool_choice")
    return spec


def parse_message(m: dict, i: int) -> dict:
    """The tool fields of one chat message: a `tool` result's tool_call_id, an assistant's tool_calls
    (arguments as the JSON string the API sends)."""
    out: dict = {}
    if m.get("role") == "tool":
        out["tool_call_id"] = str(m.get("tool_call_id") or "")
    calls = m.get("tool_calls")
    if calls:
        if m.get("role") != "assistant" or not isinstance(calls, list):
            raise ToolError(f"messages[{i}].tool_calls: only an assistant message has a list of tool calls",
                            f"messages[{i}].tool_calls")
        parsed = []
        for j, c in enumerate(calls):
            f = c.get("function") if isinstance(c, dict) else None
            try:
                args = json.loads(f["arguments"]) if isinstance(f.get("arguments"), str) else f.get("arguments")
                assert isinstance(f["name"], str) and isinstance(args, dict)
            except (TypeError, KeyError, AssertionError, AttributeError, json.JSONDecodeError):
                raise ToolError(f"messages[{i}].tool_calls[{j}] must be {{\"id\", \"type\": \"function\", "
                                f"\"function\": {{\"name\", \"arguments\": a JSON object as a string}}}}",
                                f"messages[{i}].tool_calls[{j}]") from None
            parsed.append({"id": c.get("id"), "type": "function", "function": {"name": f["name"], "arguments": args}})
        out["tool_calls"] = parsed
    return out


# ------------------------------------------------------------------------------------------- rendering
def renders_tools(tokenizer) -> bool:
    """Does the chat template show the tools it is given? (Rendered once with a sentinel tool.)"""
    cached = getattr(tokenizer, "_renders_tools", None)
    if cached is None:
        probe = {"type": "function", "function": {"name": "llama_npu_probe_fn", "parameters": NO_ARGS}}
        try:
            text = tokenizer.render_chat([{"role": "user", "content": "x"}], tools=[probe])
            cached = "llama_npu_probe_fn" in text
        except Exception:  # noqa: BLE001 - a template that fails on tools does not render them
            cached = False
        tokenizer._renders_tools = cached
    return cached


def syntax_for(tokenizer) -> ToolSyntax:
    """The call syntax of the template (the generic Hermes one when the template does not render tools)."""
    if not renders_tools(tokenizer):
        return GENERIC
    tpl = tokenizer.chat_template or ""
    return next((s for s in SYNTAXES if any(mk in tpl for mk in s.markers)), GENERIC)


def _call_text(syntax: ToolSyntax, name: str, args: dict) -> str:
    return syntax.start + json.dumps({"name": name, syntax.args_key: args}, ensure_ascii=False) + syntax.end


def render(tokenizer, messages: list[dict], spec: ToolSpec | None) -> list[int]:
    """Token ids of the conversation with its tools (spec None or choice "none": the tools are not shown)."""
    tools = spec.tools if spec is not None and spec.choice != "none" else None
    if renders_tools(tokenizer):
        msgs = [{**m, "content": m.get("content") or ""} for m in messages]
        return tokenizer.apply_chat_template(msgs, tools=tools)
    msgs: list[dict] = []
    for m in messages:
        if m["role"] == "tool":
            block = f"<tool_response>\n{m['content']}\n</tool_response>"
            if msgs and msgs[-1].get("_tool"):
                msgs[-1]["content"] += "\n" + block
            else:
                msgs.append({"role": "user", "content": block, "_tool": True})
            continue
        text = m.get("content") or ""
        for c in m.get("tool_calls") or ():
            text += ("\n" if text else "") + _call_text(GENERIC, c["function"]["name"], c["function"]["arguments"])
        msgs.append({"role": m["role"], "content": text})
    msgs = [{"role": m["role"], "content": m["content"]} for m in msgs]
    if tools:
        block = GENERIC_BLOCK.format(tools="\n".join(json.dumps(t, ensure_ascii=False) for t in tools))
        if msgs and msgs[0]["role"] == "system":
            msgs[0] = {"role": "system", "content": msgs[0]["content"] + "\n\n" + block}
        else:
            msgs.insert(0, {"role": "system", "content": block})
    return tokenizer.apply_chat_template(msgs)


def _call_schema(syntax: ToolSyntax, spec: ToolSpec, names: list[str]) -> dict:
    """{"name": <one of names>, <args_key>: <valid against that tool's parameters>}. Each tool's schema sits
    under the root's $defs (its own "#/..." references rebased there), so references inside a tool's
    parameters still resolve within the one call schema."""
    defs = {f"tool{k}": _rebase(spec.schema(n), f"#/$defs/tool{k}") for k, n in enumerate(names)}
    alts = [{"type": "object", "properties": {"name": {"const": n}, syntax.args_key: {"$ref": f"#/$defs/tool{k}"}},
             "required": ["name", syntax.args_key], "additionalProperties": False} for k, n in enumerate(names)]
    return {**(alts[0] if len(alts) == 1 else {"anyOf": alts}), "$defs": defs}


def forced_grammar(syntax: ToolSyntax, spec: ToolSpec) -> str:
    """A Lark grammar (llguidance) for tool_choice "required" / named: one call (several when the syntax and
    parallel_tool_calls allow it) to one of the allowed tools, its arguments valid against the tool's schema."""
    names = [spec.named] if spec.choice == "named" else spec.names
    call = _call_schema(syntax, spec, names)
    # parallel: up to one call per tool (a model not trained on the syntax may otherwise go on calling)
    many = len(names) if syntax.parallel and spec.parallel else 1
    rule = "call"
    for _ in range(many - 1):
        rule = f"call ({lark_string(syntax.separator)} {rule})?"
    return (f"start: {rule}\n"
            f"call: {lark_string(syntax.start) if syntax.start else ''} {schema_lark(call)} "
            f"{lark_string(syntax.end) if syntax.end else ''}\n")


def auto_trigger(syntax: ToolSyntax) -> str | None:
    """tool_choice "auto": the text that opens a call (the call grammar takes over from there), if any."""
    return syntax.start.strip() or None


def auto_grammar(syntax: ToolSyntax, spec: ToolSpec) -> str:
    """The rest of one call after its trigger (auto_trigger): arguments valid against the named tool's schema."""
    rest = syntax.start[len(syntax.start.strip()):]
    return (f"start: {lark_string(rest) if rest else ''} {schema_lark(_call_schema(syntax, spec, spec.names))} "
            f"{lark_string(syntax.end) if syntax.end else ''}\n")


def _rebase(schema, root: str):
    """`schema` with every local reference ("#", "#/...") made relative to `root`."""
    if isinstance(schema, list):
        return [_rebase(v, root) for v in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _rebase(v, root) for k, v in schema.items()}
    ref = schema.get("$ref")
    if isinstance(ref, str) and (ref == "#" or ref.startswith("#/")):
        out["$ref"] = root + ref[1:]
    return out


def new_call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]
