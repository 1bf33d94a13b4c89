"""Tool calls, grammar constraints and logits processors without a server: the request checks, the
streamed tool-call parser over random delta splits, the forced-call grammar (llguidance) on the embedded
model's tokenizer, the generic rendering for a template without tools, penalties / logit_bias / logprobs."""
from __future__ import annotations

import json
import random

import numpy as np
import pytest

from llama_npu.constrained import GrammarEngine, GrammarError
from llama_npu.processors import LogitBias, Penalties, log_softmax, top_k
from llama_npu.serve_api import ApiError, parse_chat, parse_completion
from llama_npu.tool_calls import GENERIC, SYNTAXES, ToolSpec, forced_grammar, render, renders_tools, syntax_for
from llama_npu.tool_stream import ToolCallStream

MODEL = "smollm2-135m-instruct"
USER = [{"role": "user", "content": "hi"}]
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}},
    "required": ["city", "unit"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "properties": {"tz": {"type": "string"}}, "required": ["tz"], "additionalProperties": False}}}


@pytest.fixture(scope="module")
def tokenizer():
    from llama_npu.model_source import resolve_model
    from llama_npu.tokenizer import Tokenizer

    return Tokenizer(resolve_model(None, progress=False))


@pytest.fixture(scope="module")
def grammar(tokenizer):
    stops = {tokenizer.token_to_id("<|im_end|>"), tokenizer.token_to_id("<|endoftext|>")}
    return GrammarEngine.for_tokenizer(tokenizer, stops, tokenizer.vocab_size)


# ------------------------------------------------------------------------------------------- request checks
@pytest.mark.parametrize("extra, param", [
    ({"tools": {"type": "function"}}, "tools"),
    ({"tools": [{"type": "function"}]}, "tools[0]"),
    ({"tools": [{"type": "function", "function": {"name": "has space"}}]}, "tools[0].function.name"),
    ({"tools": [WEATHER, WEATHER]}, "tools[1].function.name"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "array"}}}]},
     "tools[0].function.parameters"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
    ({"tools": [WEATHER], "tool_choice": "always"}, "tool_choice"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": [WEATHER], "parallel_tool_calls": "yes"}, "parallel_tool_calls"),
    ({"response_format": {"type": "xml"}}, "response_format"),
    ({"response_format": {"type": "json_schema"}}, "response_format.json_schema"),
    ({"top_logprobs": 3}, "top_logprobs"),
    ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ({"presence_penalty": 3}, "presence_penalty"),
    ({"frequency_penalty": "x"}, "frequency_penalty"),
    ({"logit_bias": {"abc": 1}}, "logit_bias"),
    ({"logit_bias": {"5": 101}}, "logit_bias"),
    ({"messages": [{"role": "assistant", "content": None, "tool_calls": [{"function": {"name": "f"}}]}]},
     "messages[0].tool_calls[0]"),
])
def test_bad_tool_and_sampling_fields_are_400_naming_the_field(extra, param):
    with pytest.raises(ApiError) as e:
        parse_chat({"messages": USER, **extra}, MODEL)
    assert e.value.status == 400 and e.value.param == param, e.value.message


def test_tool_fields_parse():
    req = parse_chat({"messages": USER + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "P"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"}],
        "tools": [WEATHER, TIME], "tool_choice": {"type": "function", "function": {"name": "get_time"}},
        "parallel_tool_calls": False, "logprobs": True, "top_logprobs": 2, "logit_bias": {"7": -5}}, MODEL)
    o = req.options
    assert (o.tools.choice, o.tools.named, o.tools.parallel, o.logprobs, o.top_logprobs, o.logit_bias) == \
        ("named", "get_time", False, True, 2, {7: -5.0})
    assert req.messages[1]["tool_calls"][0]["function"]["arguments"] == {"city": "P"}
    assert req.messages[2] == {"role": "tool", "content": "sunny", "tool_call_id": "c1"}
    assert parse_completion({"prompt": "x", "logprobs": 3}, MODEL).options.top_logprobs == 3
    with pytest.raises(ApiError):
        parse_completion({"prompt": "x", "tools": [WEATHER]}, MODEL)


# ------------------------------------------------------------------------------------------- rendering
def test_the_embedded_template_ignores_tools_so_the_generic_rendering_is_used(tokenizer):
    assert not renders_tools(tokenizer) and syntax_for(tokenizer) is GENERIC
    spec = ToolSpec([WEATHER], "auto")
    history = USER + [
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "P"}}}]},
        {"role": "tool", "content": "sunny", "tool_call_id": "c1"},
        {"role": "tool", "content": "warm", "tool_call_id": "c2"}]
    text = tokenizer.decode(render(tokenizer, history, spec), skip_special_tokens=False)
    assert text.startswith("<|im_start|>system\nYou may call one or more functions")
    assert json.dumps(WEATHER) in text
    assert ('<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "P"}}\n'
            '</tool_call>') in text
    assert ("<|im_start|>user\n<tool_response>\nsunny\n</tool_response>\n<tool_response>\nwarm\n"
            "</tool_response><|im_end|>") in text  # two results: one user turn
    none = tokenizer.decode(render(tokenizer, USER, ToolSpec([WEATHER], "none")), skip_special_tokens=False)
    assert "get_weather" not in none


HERMES_LIKE = (
    "{% if tools %}<|im_start|>system\nTools:{% for t in tools %} {{ t.function.name }}{% endfor %}<|im_end|>\n"
    "{% endif %}{% for m in messages %}<|im_start|>{{ m.role }}\n{% if m.tool_calls %}{% for c in m.tool_calls %}"
    "<tool_call>\n{{ c.function | tojson }}\n</tool_call>{% endfor %}{% else %}{{ m.content }}{% endif %}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def test_a_template_that_renders_tools_gets_them_natively(tokenizer):
    import copy

    tok = copy.copy(tokenizer)
    tok.chat_template, tok._template, tok._renders_tools = HERMES_LIKE, None, None
    assert renders_tools(tok) and syntax_for(tok).name == "hermes"
    history = USER + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "P"}}}]},
        {"role": "tool", "content": "sunny", "tool_call_id": "c1"}]
    text = tok.decode(render(tok, history, ToolSpec([WEATHER, TIME], "auto")), skip_special_tokens=False)
    assert text.startswith("<|im_start|>system\nTools: get_weather get_time<|im_end|>")
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "P"}}\n</tool_call>' in text
    assert "<|im_start|>tool\nsunny<|im_end|>" in text and "You may call" not in text


def test_syntax_table_is_keyed_by_the_template():
    class Tpl:
        def __init__(self, text):
            self.chat_template, self._renders_tools = text, True

    assert syntax_for(Tpl("{{ tools }} <tool_call> ...")).name == "hermes"
    assert syntax_for(Tpl('{{ tools }} {"name": function name, "parameters": dictionary of ...}')).name == \
        "llama3_json"


# ------------------------------------------------------------------------------------------- grammar
def _feed(constraint, tokenizer, text: str) -> bool:
    """Whether the constraint accepts `text` (its tokens one by one, each allowed by the mask)."""
    ids = tokenizer.encode(text, add_special_tokens=False)
    logits = np.zeros(constraint.vocab, dtype=np.float32)
    for i, t in enumerate(ids):
        masked = constraint(ids[:i], logits)
        if not np.isfinite(masked[t]):
            return False
    constraint(ids, logits)
    return constraint.accepting


@pytest.mark.parametrize("parallel", [True, False])
def test_forced_call_grammar(grammar, tokenizer, parallel):
    spec = ToolSpec([WEATHER, TIME], "required", parallel=parallel)
    one = '<tool_call>\n{"name": "get_time", "arguments": {"tz": "UTC"}}\n</tool_call>'
    two = one + '\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo", "unit": "c"}}\n</tool_call>'
    lark = forced_grammar(GENERIC, spec)
    assert _feed(grammar.lark(lark), tokenizer, one)
    assert _feed(grammar.lark(lark), tokenizer, two) == parallel
    assert not _feed(grammar.lark(lark), tokenizer, one.replace('"UTC"', "5"))           # schema enforced
    assert not _feed(grammar.lark(lark), tokenizer, one.replace("get_time", "get_date"))  # only known tools
    named = forced_grammar(GENERIC, ToolSpec([WEATHER, TIME], "named", "get_weather"))
    assert not _feed(grammar.lark(named), tokenizer, one)
    llama = forced_grammar(SYNTAXES[1], spec)
    assert _feed(grammar.lark(llama), tokenizer, '{"name": "get_time", "parameters": {"tz": "UTC"}}')


def test_references_inside_a_tools_schema_resolve_in_the_call_grammar(grammar, tokenizer):
    tree = {"type": "function", "function": {"name": "plant", "parameters": {
        "$defs": {"node": {"type": "object", "properties": {"v": {"type": "integer"}, "kids": {
            "type": "array", "items": {"$ref": "#/$defs/node"}}}, "required": ["v", "kids"],
            "additionalProperties": False}},
        "type": "object", "properties": {"root": {"$ref": "#/$defs/node"}}, "required": ["root"],
        "additionalProperties": False}}}
    lark = forced_grammar(GENERIC, ToolSpec([WEATHER, tree], "required"))
    ok = '<tool_call>\n{"name": "plant", "arguments": {"root": {"v": 1, "kids": [{"v": 2, "kids": []}]}}}\n</tool_call>'
    assert _feed(grammar.lark(lark), tokenizer, ok)
    assert not _feed(grammar.lark(lark), tokenizer, ok.replace('"v": 2', '"w": 2'))


def _lazy_walk(grammar, tokenizer, text: str) -> list[bool]:
    """Per token of `text`: was it allowed by the auto-mode constraint (Triggered) at its step?"""
    from llama_npu.constrained import Triggered
    from llama_npu.tool_calls import auto_grammar, auto_trigger

    lark = auto_grammar(GENERIC, ToolSpec([WEATHER, TIME], "auto"))
    lazy = Triggered(lambda: grammar.lark(lark), auto_trigger(GENERIC), tokenizer.decode,
                     lambda t: tokenizer.encode(t, add_special_tokens=False))
    ids = tokenizer.encode(text, add_special_tokens=False)
    logits = np.zeros(tokenizer.vocab_size, dtype=np.float32)
    return [bool(np.isfinite(lazy(ids[:i], logits)[t])) for i, t in enumerate(ids)]


def test_auto_mode_constrains_a_call_once_it_is_opened(grammar, tokenizer):
    call = '<tool_call>\n{"name": "get_time", "arguments": {"tz": "UTC"}}\n</tool_call>'
    text = "Let me check. " + call + " Anything else? " + call.replace("get_time", "get_weather").replace(
        '"tz": "UTC"', '"city": "Oslo", "unit": "c"')
    assert all(_lazy_walk(grammar, tokenizer, text))          # free text, two valid calls, free text between
    bad = _lazy_walk(grammar, tokenizer, "Sure. " + call.replace('"UTC"', "7"))
    assert not all(bad) and all(bad[:5])                      # the wrong argument type is masked, text before is free
    assert all(_lazy_walk(grammar, tokenizer, "No call here: {\"name\": 7}"))


def test_bad_schemas_name_the_problem(grammar):
    for schema, words in (({"type": "foo"}, "not a valid JSON schema"), ({"$ref": "#/nope"}, "/nope"),
                          ({"type": "string", "format": "weird"}, "Unknown format: weird"),
                          ([1], "must be a JSON object")):
        with pytest.raises(GrammarError, match=words):
            grammar.json_schema(schema)


def test_mask_leaves_allowed_logits_untouched(grammar, tokenizer):
    c = grammar.json_schema({"enum": ["yes", "no"]})
    logits = np.random.default_rng(0).standard_normal(c.vocab).astype(np.float32)
    out = c([], logits)
    allowed = np.isfinite(out)
    assert 0 < allowed.sum() < 100 and np.array_equal(out[allowed], logits[allowed])
    assert tokenizer.encode('"', add_special_tokens=False)[0] in np.flatnonzero(allowed)


# ------------------------------------------------------------------------------------------- stream parser
CALLS_TEXT = ('Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "a}b\\"c", '
              '"unit": "c"}}\n</tool_call>\n<tool_call>\n{"name": "get_time", "arguments": {"tz": "[UTC]"}}\n'
              '</tool_call>')


@pytest.mark.parametrize("incremental", [True, False])
def test_streamed_tool_calls_survive_any_split(incremental):
    rng = random.Random(1)
    for _ in range(200):
        cuts = sorted(rng.sample(range(1, len(CALLS_TEXT)), rng.randint(0, 30)))
        pieces = [CALLS_TEXT[a:b] for a, b in zip([0] + cuts, cuts + [len(CALLS_TEXT)])]
        s = ToolCallStream(GENERIC, ["get_weather", "get_time"], incremental)
        events = [e for p in pieces for e in s.push(p)] + s.finish()
        assert "".join(e[1] for e in events if e[0] == "content") == "Let me check."
        names = [e[3] for e in events if e[0] == "call"]
        assert names == ["get_weather", "get_time"]
        for i, c in enumerate(s.calls):  # the fragments concatenate to arguments that parse
            assert "".join(e[2] for e in events if e[0] == "args" and e[1] == i) == c["arguments"]
        assert [json.loads(c["arguments"]) for c in s.calls] == [{"city": 'a}b"c', "unit": "c"}, {"tz": "[UTC]"}]


def test_unparsable_or_unknown_calls_stay_text():
    for text in ('<tool_call>\n{"name": "rm", "arguments": {}}\n</tool_call>', "<tool_call>\n{broken\n</tool_call>",
                 "a <tool_ca"):
        s = ToolCallStream(GENERIC, ["get_weather"], incremental=False)
        events = s.push(text) + s.finish()
        assert not s.calls and "".join(e[1] for e in events) == text
    s = ToolCallStream(SYNTAXES[1], ["f"], incremental=True)
    events = s.push('{"name": "f", "parameters": {"a": [1, 2]}}') + s.finish()
    assert s.calls[0]["arguments"] == '{"a": [1, 2]}' and not [e for e in events if e[0] == "content"]


# ------------------------------------------------------------------------------------------- processors
def test_penalties_follow_the_openai_formula():
    p = Penalties(6, presence=0.5, frequency=0.25)
    logits = np.zeros(6, dtype=np.float32)
    assert np.array_equal(p([], logits), logits)
    out = p([2, 2, 4], logits)
    assert np.allclose(out, [0, 0, -(0.5 + 0.5), 0, -(0.5 + 0.25), 0])
    bias = LogitBias(6, {1: -100.0, 3: 2.5})
    assert np.allclose(bias([], logits), [0, -100, 0, 2.5, 0, 0])


def test_log_softmax_and_top_k():
    logits = np.array([1.0, 3.0, -np.inf, 3.0, 0.5], dtype=np.float32)
    lp = log_softmax(logits)
    assert np.isclose(np.exp(lp[np.isfinite(lp)]).sum(), 1.0, atol=1e-6) and lp[2] == -np.inf
    assert [t for t, _ in top_k(lp, 3)] == [1, 3, 0]  # ties: the smaller id first
    assert [t for t, _ in top_k(lp, 5)] == [1, 3, 0, 4]  # an impossible token is never listed
