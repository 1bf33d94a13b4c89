"""`llama-npu serve` driven by the official `openai` client: the embedded SmolLM2-135M on emu, one server
process for the whole module (loading takes ~10-20 s), greedy sampling and small max_tokens throughout.
Plus the stop-string hold-back and the request validation on their own (no server)."""
from __future__ import annotations

import json
import os
import random
import socket
import threading
import urllib.error
import urllib.request

import pytest

from llama_npu.serve_api import ApiError, parse_chat, parse_completion, parse_json
from llama_npu.serve_worker import StopStrings
from tooling import require_module

openai = require_module("openai")  # the test extra

MODEL = "smollm2-135m-instruct"
FRANCE = [{"role": "user", "content": "What is the capital of France?"}]
GERMANY = [{"role": "user", "content": "What is the capital of Germany?"}]


# ------------------------------------------------------------------------------------------- no server
def _stream_through(stops: list[str], pieces: list[str]) -> tuple[list[str], bool]:
    s = StopStrings(stops)
    out = [s.push(p) for p in pieces]
    out.append(s.flush())
    return out, s.hit


def test_stop_string_split_across_deltas_never_leaks():
    rng = random.Random(0)
    text = "The capital of France is Paris. It is a city on the Seine."
    for stops in (["Paris"], ["France is P"], ["Seine.", "city"], ["e"], ["zzz"], ["is Paris. It"]):
        first = min((text.find(s) for s in stops if s in text), default=-1)
        want = text if first < 0 else text[:first]
        for _ in range(200):  # random cut points, including 1-character deltas
            cuts = sorted(rng.sample(range(1, len(text)), rng.randint(0, 12)))
            pieces = [text[a:b] for a, b in zip([0] + cuts, cuts + [len(text)])]
            out, hit = _stream_through(stops, pieces)
            assert "".join(out) == want, (stops, pieces)
            assert hit == (first >= 0)
            emitted = ""
            for piece in out:  # no prefix of the output ever contains a stop string
                emitted += piece
                assert not any(s in emitted for s in stops)


def test_text_that_only_looks_like_a_stop_string_is_released():
    out, hit = _stream_through(["Paris"], ["Par", "is", "ian"])
    assert "".join(out) == "" and hit
    out, hit = _stream_through(["Paris!"], ["Par", "is", "ian"])
    assert not hit and "".join(out) == "Parisian" and out[0] == ""  # held back, then released


@pytest.mark.parametrize("body, status, param", [
    ({"model": MODEL}, 400, "messages"),
    ({"messages": []}, 400, "messages"),
    ({"messages": [{"role": "wizard", "content": "hi"}]}, 400, "messages[0].role"),
    ({"messages": [{"content": "hi"}]}, 400, "messages[0].role"),
    ({"messages": FRANCE, "n": 2}, 400, "n"),
    ({"messages": FRANCE, "model": "gpt-4o"}, 404, "model"),
    ({"messages": FRANCE, "temperature": 3}, 400, "temperature"),
    ({"messages": FRANCE, "top_p": 0}, 400, "top_p"),
    ({"messages": FRANCE, "max_tokens": 0}, 400, "max_tokens"),
    ({"messages": FRANCE, "max_completion_tokens": "8"}, 400, "max_completion_tokens"),
    ({"messages": FRANCE, "stop": [1]}, 400, "stop"),
    ({"messages": FRANCE, "stream": "yes"}, 400, "stream"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, 400, "messages[0].content"),
])
def test_chat_request_validation(body, status, param):
    with pytest.raises(ApiError) as e:
        parse_chat(body, MODEL)
    assert e.value.status == status and e.value.param == param
    assert set(e.value.body()["error"]) == {"message", "type", "param", "code"}


def test_valid_requests_parse():
    req = parse_chat({"model": MODEL, "messages": [{"role": "developer", "content": [{"type": "text", "text": "a"}]},
                                                   {"role": "user", "content": "b"}],
                      "max_tokens": 5, "max_completion_tokens": 7, "stop": "x", "seed": 3}, MODEL)
    assert req.messages == [{"role": "system", "content": "a"}, {"role": "user", "content": "b"}]
    assert (req.max_tokens, req.stop, req.seed, req.temperature) == (7, ["x"], 3, None)
    assert parse_completion({"prompt": ["hi"]}, MODEL).prompt == "hi"
    assert parse_completion({"prompt": [1, 2, 3]}, MODEL).prompt == [1, 2, 3]
    for raw in (b"{not json", b"[1, 2]", b"\xff"):
        with pytest.raises(ApiError):
            parse_json(raw)


def test_busy_port_is_one_line_before_loading(capsys):
    from llama_npu.cli import main

    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        code = main(["serve", "--device", "emu", "--port", str(port), "--no-progress"])
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert code == 2 and len(lines) == 1, lines
    assert lines[0] == f"llama-npu: error: cannot listen on 127.0.0.1:{port}: Address already in use"


# ------------------------------------------------------------------------------------------- the server
@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from benchmarks.serve import ServerProcess

    tmp = tmp_path_factory.mktemp("serve")
    env = {k: v for k, v in os.environ.items() if k not in ("MODEL", "DEVICE")}  # the embedded model
    srv = ServerProcess(["--device", "emu", "--buckets", "64,256", "--cache-dir", str(tmp / "kernels"),
                         "--max-tokens", "32"], tmp / "serve.log", env=env)
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def tokenizer():
    from llama_npu.model_source import resolve_model
    from llama_npu.tokenizer import Tokenizer

    return Tokenizer(resolve_model(None, progress=False))


def ask(client, messages, **kw):
    return client.chat.completions.create(model=MODEL, messages=messages, temperature=0,
                                          **{"max_tokens": 16, **kw})


@pytest.fixture(scope="module")
def france(client):
    return ask(client, FRANCE)


def http(server, path: str, body: bytes | dict | None = None) -> tuple[int, str, str]:
    """A plain request (the openai client sends only valid JSON): status, content type, body text."""
    data = json.dumps(body).encode() if isinstance(body, dict) else body
    req = urllib.request.Request(server.url + path, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, r.headers["Content-Type"], r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.headers["Content-Type"], e.read().decode()


def health(server) -> dict:
    status, _, text = http(server, "/health")
    assert status == 200
    return json.loads(text)


def test_the_line_names_url_and_model(server):
    assert server.line.startswith("llama-npu serve: http://127.0.0.1:") and MODEL in server.line


def test_lists_the_model(client):
    assert [m.id for m in client.models.list().data] == [MODEL]
    assert client.models.retrieve(MODEL).id == MODEL


def test_chat_answer_and_usage_match_the_tokenizer(france, tokenizer):
    text = france.choices[0].message.content
    assert "Paris" in text
    assert france.choices[0].finish_reason == "stop" and france.model == MODEL
    u = france.usage
    assert u.prompt_tokens == len(tokenizer.apply_chat_template(FRANCE))
    # every generated token counts, the end-of-turn token included
    assert u.completion_tokens == len(tokenizer.encode(text, add_special_tokens=False)) + 1
    assert u.total_tokens == u.prompt_tokens + u.completion_tokens


def test_streamed_chunks_concatenate_to_the_answer(client, france):
    chunks = list(ask(client, FRANCE, stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    content = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    assert len(content) > 2 and "".join(content) == france.choices[0].message.content
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["stop"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == france.usage.completion_tokens
    assert len({c.id for c in chunks}) == 1


def test_sse_wire_format_ends_with_done(server):
    status, ctype, text = http(server, "/v1/chat/completions",
                               {"model": MODEL, "messages": FRANCE, "max_tokens": 3, "stream": True})
    assert status == 200 and ctype.startswith("text/event-stream")
    events = [ln for ln in text.splitlines() if ln]
    assert all(ln.startswith("data: ") for ln in events) and events[-1] == "data: [DONE]"
    assert json.loads(events[-2][6:])["choices"][0]["finish_reason"] == "length"


@pytest.mark.parametrize("stream", [False, True])
def test_stop_sequence_cuts_the_answer(client, france, stream):
    full = france.choices[0].message.content
    stop = "France is P"  # spans three tokens: " France", " is", " Paris"
    assert stop in full
    r = ask(client, FRANCE, stop=[stop, "never"], stream=stream)
    if stream:
        chunks = list(r)
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    else:
        text, finish = r.choices[0].message.content, [r.choices[0].finish_reason]
    assert text == full[: full.index(stop)] and finish == ["stop"]


def test_length_limit_and_completions_endpoint(client, tokenizer):
    r = ask(client, FRANCE, max_completion_tokens=3)
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 3
    c = client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=4, temperature=0)
    assert c.choices[0].finish_reason == "length" and c.usage.completion_tokens == 4
    assert c.usage.prompt_tokens == len(tokenizer.encode("The capital of France is"))
    streamed = client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=4,
                                         temperature=0, stream=True)
    assert "".join(ch.choices[0].text for ch in streamed if ch.choices) == c.choices[0].text
    ids = client.completions.create(model=MODEL, prompt=tokenizer.encode("The capital of France is"),
                                    max_tokens=4, temperature=0)
    assert ids.choices[0].text == c.choices[0].text
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=MODEL, prompt=[10**9], max_tokens=1)


def test_next_turn_reuses_the_kv_cache(client, france):
    ask(client, FRANCE)  # the conversation the next turn extends
    turn2 = FRANCE + [{"role": "assistant", "content": france.choices[0].message.content},
                      {"role": "user", "content": "And of Germany?"}]
    r = ask(client, turn2, max_tokens=4)
    cached = r.usage.prompt_tokens_details.cached_tokens
    assert france.usage.prompt_tokens <= cached < r.usage.prompt_tokens
    other = ask(client, GERMANY, max_tokens=2)  # diverges at once: computed from scratch
    assert other.usage.prompt_tokens_details.cached_tokens == 0


def test_bad_inputs_get_openai_errors_and_the_server_keeps_working(server, client, france):
    status, ctype, text = http(server, "/v1/chat/completions", b'{"model": "x", "messages": [')
    assert status == 400 and ctype == "application/json"
    assert json.loads(text)["error"]["type"] == "invalid_request_error"
    status, _, text = http(server, "/v1/chat/completions", {"model": MODEL})
    assert status == 400 and json.loads(text)["error"]["param"] == "messages"
    with pytest.raises(openai.BadRequestError) as e:
        ask(client, [{"role": "wizard", "content": "hi"}])
    assert e.value.status_code == 400 and "wizard" in e.value.message
    with pytest.raises(openai.BadRequestError) as e:
        ask(client, FRANCE, max_tokens=9000)  # the context is 8192
    assert e.value.code == "context_length_exceeded"
    with pytest.raises(openai.BadRequestError) as e:  # a prompt that alone fills the context
        ask(client, [{"role": "user", "content": "hello " * 8300}], max_tokens=None)
    assert e.value.code == "context_length_exceeded"
    with pytest.raises(openai.NotFoundError) as e:
        client.chat.completions.create(model="gpt-4o", messages=FRANCE)
    assert e.value.code == "model_not_found"
    with pytest.raises(openai.BadRequestError) as e:
        ask(client, FRANCE, n=2)
    assert e.value.param == "n"
    status, _, text = http(server, "/v1/nothing")
    assert status == 404 and "error" in json.loads(text)
    again = ask(client, FRANCE)
    assert again.choices[0].message.content == france.choices[0].message.content


def test_disconnect_mid_stream_stops_the_generation(server, client, france):
    before = health(server)
    stream = client.chat.completions.create(model=MODEL, temperature=0, max_tokens=400, stream=True, messages=[
        {"role": "user", "content": "Write a very long story about a dragon who learns to bake bread."}])
    got = 0
    for ch in stream:
        got += bool(ch.choices and ch.choices[0].delta.content)
        if got == 3:
            break
    stream.close()  # the client goes away mid-reply
    after_ok = ask(client, FRANCE)  # queued behind the abandoned reply, served once it has stopped
    assert after_ok.choices[0].message.content == france.choices[0].message.content
    after = health(server)
    assert after["pending"] == 0 and after["interrupted"] == before["interrupted"] + 1
    abandoned = after["completion_tokens"] - before["completion_tokens"] - after_ok.usage.completion_tokens
    assert 3 <= abandoned < 100, abandoned


def test_two_concurrent_clients_are_both_served(server, client, france):
    alone = ask(client, GERMANY).choices[0].message.content
    results: dict = {}

    def run(name, messages):
        c = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=120)
        if name == "germany":  # one streams, one does not
            results[name] = "".join(ch.choices[0].delta.content or "" for ch in ask(c, messages, stream=True)
                                    if ch.choices)
        else:
            results[name] = ask(c, messages).choices[0].message.content

    threads = [threading.Thread(target=run, args=a) for a in (("france", FRANCE), ("germany", GERMANY))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert results == {"france": france.choices[0].message.content, "germany": alone}
    assert "Berlin" in alone


def test_ctrl_c_shuts_down_cleanly(server):
    code = server.interrupt()
    log = server.errors()
    assert code == 0, log
    assert "Traceback" not in log and "llama-npu serve: stopped" in log
