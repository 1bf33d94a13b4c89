"""What agents and apps need from `serve` (issue 27), driven by the official `openai` client against the
embedded SmolLM2-135M on emu (one server for the module): tool calls forced by the grammar and parsed from
the reply (streamed and not), the tool loop, structured output (json_schema / json_object), logprobs
against the engine's own log-softmax, seed, logit_bias, and the 400s for bad schemas / tools."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest

from tooling import require_module

openai = require_module("openai")
jsonschema = require_module("jsonschema")

MODEL = "smollm2-135m-instruct"
WEATHER_Q = [{"role": "user", "content": "What is the weather in Paris?"}]
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Current weather in a city",
                                      "parameters": {"type": "object", "properties": {
                                          "city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]}},
                                          "required": ["city", "unit"], "additionalProperties": False}}},
    {"type": "function", "function": {"name": "get_time", "description": "Current time in a timezone",
                                      "parameters": {"type": "object", "properties": {"timezone": {"type": "string"}},
                                                     "required": ["timezone"], "additionalProperties": False}}},
]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
PET = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 6},
    "kind": {"enum": ["cat", "dog", "bird"]},
    "size": {"type": "object", "properties": {"w": {"type": "integer", "minimum": 0, "maximum": 99}},
             "required": ["w"], "additionalProperties": False},
    "tags": {"type": "array", "items": {"enum": ["small", "big", "cute"]}, "minItems": 1, "maxItems": 2}},
    "required": ["name", "kind", "size", "tags"], "additionalProperties": False}
# The grammar bounds a PET answer: 6 characters of at most 4 tokens each + the fixed keys and punctuation
# + 2 digits + 2 tags stay under this, so every answer completes (finish_reason "stop") before the limit.
PET_MAX_TOKENS = 80


@pytest.fixture(scope="module")
def server(tmp_path_factory, kernel_cache_dir):
    from benchmarks.serve import ServerProcess

    tmp = tmp_path_factory.mktemp("serve_tools")
    env = {k: v for k, v in os.environ.items() if k not in ("MODEL", "DEVICE")}  # the embedded model
    srv = ServerProcess(["--device", "emu", "--buckets", "64,256", "--cache-dir", str(kernel_cache_dir),
                         "--max-tokens", "32"], tmp / "serve.log", env=env)
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=300)


def chat(client, messages, **kw):
    return client.chat.completions.create(model=MODEL, messages=messages, **{"temperature": 0, "max_tokens": 100,
                                                                            **kw})


def _check_calls(calls: list[dict]) -> None:
    assert calls
    for c in calls:
        assert c["name"] in SCHEMAS and c["id"].startswith("call_")
        jsonschema.validate(json.loads(c["arguments"]), SCHEMAS[c["name"]])


# ------------------------------------------------------------------------------------------- tools
@pytest.fixture(scope="module")
def forced(client):
    return chat(client, WEATHER_Q, tools=TOOLS, tool_choice="required")


def test_required_tool_call_validates_against_the_tool_schema(forced):
    choice = forced.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    _check_calls([{"id": c.id, "name": c.function.name, "arguments": c.function.arguments}
                  for c in choice.message.tool_calls])


def test_required_tool_call_streamed_as_deltas(client, forced):
    calls: dict[int, dict] = {}
    finishes = []
    for ch in chat(client, WEATHER_Q, tools=TOOLS, tool_choice="required", stream=True):
        if not ch.choices:
            continue
        finishes += [ch.choices[0].finish_reason] if ch.choices[0].finish_reason else []
        assert not ch.choices[0].delta.content
        for d in ch.choices[0].delta.tool_calls or ():
            if d.index not in calls:  # the first delta of a call: id, type and name, no arguments yet
                assert d.id and d.type == "function" and d.function.name and d.function.arguments == ""
                calls[d.index] = {"id": d.id, "name": d.function.name, "arguments": "", "fragments": 0}
            else:                     # then argument fragments only
                assert d.id is None and d.function.name is None
                calls[d.index]["arguments"] += d.function.arguments
                calls[d.index]["fragments"] += 1
    assert finishes == ["tool_calls"]
    _check_calls(list(calls.values()))
    assert max(c["fragments"] for c in calls.values()) > 2  # streamed as generated, not in one piece
    same = [(c.function.name, c.function.arguments) for c in forced.choices[0].message.tool_calls]
    assert [(c["name"], c["arguments"]) for c in calls.values()] == same  # greedy: the same calls


def test_named_tool_choice_and_no_parallel_calls(client):
    r = chat(client, WEATHER_Q, tools=TOOLS, parallel_tool_calls=False,
             tool_choice={"type": "function", "function": {"name": "get_time"}})
    calls = r.choices[0].message.tool_calls
    assert [c.function.name for c in calls] == ["get_time"] and r.choices[0].finish_reason == "tool_calls"
    jsonschema.validate(json.loads(calls[0].function.arguments), SCHEMAS["get_time"])


def test_the_tool_loop_ends_in_text(client, forced):
    msg = forced.choices[0].message
    history = WEATHER_Q + [msg.model_dump(exclude_none=True)] + [
        {"role": "tool", "tool_call_id": c.id, "content": json.dumps({"temperature_c": 18, "sky": "sunny"})}
        for c in msg.tool_calls]
    r = chat(client, history, tools=TOOLS, max_tokens=24)
    assert r.choices[0].message.tool_calls is None and r.choices[0].message.content.strip()
    assert r.usage.prompt_tokens > forced.usage.prompt_tokens + 20  # the calls and results were rendered


def test_tool_choice_none_gives_text(client):
    r = chat(client, WEATHER_Q, tools=TOOLS, tool_choice="none", max_tokens=12)
    assert r.choices[0].message.tool_calls is None and r.choices[0].message.content.strip()
    assert r.choices[0].finish_reason in ("stop", "length")


# ------------------------------------------------------------------------------------------- structured output
def test_json_schema_samples_all_validate(client):
    fmt = {"type": "json_schema", "json_schema": {"name": "pet", "schema": PET, "strict": True}}
    for seed in range(20):
        r = chat(client, [{"role": "user", "content": "Describe a pet as JSON."}], temperature=1, seed=seed,
                 max_tokens=PET_MAX_TOKENS, response_format=fmt)
        assert r.choices[0].finish_reason == "stop", r.choices[0].message.content
        jsonschema.validate(json.loads(r.choices[0].message.content), PET)


def test_json_cut_off_by_max_tokens_says_length(client):
    fmt = {"type": "json_schema", "json_schema": {"name": "pet", "schema": PET}}
    r = chat(client, [{"role": "user", "content": "Describe a pet as JSON."}], max_tokens=4, response_format=fmt,
             logprobs=True, top_logprobs=20)
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 4
    assert r.choices[0].message.content.startswith('{"name": "')
    # the grammar leaves few possible tokens at each step: only they are listed (a masked token has no logprob)
    entries = r.choices[0].logprobs.content
    assert all(np.isfinite(t.logprob) for e in entries for t in e.top_logprobs)
    few = min(entries, key=lambda e: len(e.top_logprobs))
    assert len(few.top_logprobs) < 20  # then they are all the allowed tokens: their probabilities sum to 1
    assert np.isclose(sum(np.exp(t.logprob) for t in few.top_logprobs), 1.0, atol=1e-3)


def test_json_object_answers_parse(client):
    # free JSON has no bound on its length: greedy answers (a sampled one may still be cut by max_tokens,
    # then finish_reason says "length")
    for ask in ("Give a city and its country as JSON.", "Describe a person with a name and an age as JSON.",
                "Give the capital of France as JSON."):
        r = chat(client, [{"role": "user", "content": ask}], max_tokens=64, response_format={"type": "json_object"})
        assert r.choices[0].finish_reason == "stop", r.choices[0].message.content
        assert isinstance(json.loads(r.choices[0].message.content), dict)


# ------------------------------------------------------------------------------------------- logprobs & sampling
COLOR = [{"role": "user", "content": "Name a primary color."}]


def _evict(client) -> None:
    """One request whose prompt shares (at most) the chat template's head with the tests' prompts."""
    chat(client, [{"role": "user", "content": "Say hello to everyone in the room, please."}], max_tokens=1)


def test_logprobs_match_the_engines_log_softmax(client, kernel_cache_dir):
    from llama_npu.engine import Engine

    r = chat(client, COLOR, max_tokens=6, logprobs=True, top_logprobs=5)
    got = r.choices[0].logprobs.content
    eng = Engine.load(None, device="emu", buckets=(64, 256), cache_dir=kernel_cache_dir, progress=False)
    logits = eng.prefill(eng.tokenizer.apply_chat_template(COLOR)).logits
    assert len(got) == r.usage.completion_tokens - (r.choices[0].finish_reason == "stop")
    for entry in got:
        z = logits.astype(np.float64)
        ref = z - (z.max() + np.log(np.exp(z - z.max()).sum()))  # log-softmax, computed here
        tok = int(np.argmax(logits))                               # greedy
        assert entry.token == eng.tokenizer.decode([tok], skip_special_tokens=False)
        assert abs(entry.logprob - ref[tok]) < 1e-3
        assert entry.top_logprobs[0].token == entry.token and entry.top_logprobs[0].logprob == entry.logprob
        order = np.argsort(-ref, kind="stable")[:5]
        assert np.allclose([t.logprob for t in entry.top_logprobs], ref[order], atol=1e-3)
        assert bytes(entry.bytes).decode() == entry.token
        logits = eng.decode_step(tok)
    # the same prompt right after itself would reuse all but its last token from the KV cache, and that token
    # goes through the decode path, whose bf16 logits differ from prefill's (log-probabilities by up to ~0.5
    # here): a different conversation in between makes the streamed request compute its prompt as `r` did
    _evict(client)
    streamed = [lp for ch in chat(client, COLOR, max_tokens=6, logprobs=True, top_logprobs=5, stream=True)
                if ch.choices and ch.choices[0].logprobs for lp in ch.choices[0].logprobs.content]
    assert [(e.token, e.logprob) for e in streamed] == [(e.token, e.logprob) for e in got]
    c = client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=3, temperature=0,
                                  logprobs=2)
    lp = c.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == 3 and "".join(lp.tokens) == c.choices[0].text
    assert all(max(top.values()) == v for top, v in zip(lp.top_logprobs, lp.token_logprobs))
    _evict(client)
    chunks = client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=3, temperature=0,
                                       logprobs=2, stream=True)
    streamed_c = [(t, v) for ch in chunks if ch.choices and ch.choices[0].logprobs
                  for t, v in zip(ch.choices[0].logprobs.tokens, ch.choices[0].logprobs.token_logprobs)]
    assert streamed_c == list(zip(lp.tokens, lp.token_logprobs))


def test_seed_reproduces_a_sample_and_logit_bias_applies(client, tokenizer_ids):
    a = chat(client, COLOR, temperature=1, seed=11, max_tokens=8).choices[0].message.content
    _evict(client)  # b computes its prompt as a did (see test_logprobs_match_the_engines_log_softmax)
    b = chat(client, COLOR, temperature=1, seed=11, max_tokens=8).choices[0].message.content
    assert a == b
    first = chat(client, COLOR, max_tokens=1).choices[0].message.content
    banned = tokenizer_ids(first)[0]
    r = chat(client, COLOR, max_tokens=1, logit_bias={str(banned): -100})
    assert r.choices[0].message.content != first
    forced = tokenizer_ids(" Purple")[0]
    r = chat(client, COLOR, max_tokens=1, logit_bias={str(forced): 100})
    assert tokenizer_ids(r.choices[0].message.content) == [forced]
    r = chat(client, COLOR, max_tokens=8, presence_penalty=2, frequency_penalty=2)
    assert r.choices[0].message.content


@pytest.fixture(scope="module")
def tokenizer_ids():
    from llama_npu.model_source import resolve_model
    from llama_npu.tokenizer import Tokenizer

    tok = Tokenizer(resolve_model(None, progress=False))
    return lambda text: tok.encode(text, add_special_tokens=False)


# ------------------------------------------------------------------------------------------- errors
@pytest.mark.parametrize("kw, param, words", [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "foo"}}}},
     "response_format", "not a valid JSON schema"),
    ({"response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "string", "pattern": "(?<=a)b"}}}}, "response_format", "look-around"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "get_date"}}}, "tool_choice",
     "get_date"),
    ({"tools": [{"type": "function", "function": {"description": "no name"}}]}, "tools[0].function.name", "name"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"a": {"type": "strin"}}}}}]}, "tools[0].function.parameters",
     "not a valid JSON schema"),
])
def test_bad_schemas_and_tools_are_400_and_the_server_goes_on(client, kw, param, words):
    with pytest.raises(openai.BadRequestError) as e:
        chat(client, WEATHER_Q, **kw)
    err = e.value.body
    assert e.value.status_code == 400 and err["type"] == "invalid_request_error" and err["param"] == param
    assert words in err["message"], err["message"]
    assert chat(client, COLOR, max_tokens=2).choices[0].finish_reason == "length"
