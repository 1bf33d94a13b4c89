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
from llama_npu.generation import StopStrings
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
    # --context 512 below the model's 8192, with the default --max-tokens 1024: requests without max_tokens
    # must be budgeted with this run's context (they were refused when the model's was used)
    srv = ServerProcess(["--device", "emu", "--buckets", "64,256", "--cache-dir", str(tmp / "kernels"),
                         "--context", "512"], tmp / "serve.log", env=env)
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


def test_next_turn_reuses_the_kv_cache(client, france, tokenizer):
    ask(client, FRANCE)  # the conversation the next turn extends
    turn2 = FRANCE + [{"role": "assistant", "content": france.choices[0].message.content},
                      {"role": "user", "content": "And of Germany?"}]
    r = ask(client, turn2, max_tokens=4)
    cached = r.usage.prompt_tokens_details.cached_tokens
    assert france.usage.prompt_tokens <= cached < r.usage.prompt_tokens
    other = ask(client, GERMANY, max_tokens=2)  # another conversation: only the shared template head is reused
    f_ids, g_ids = (tokenizer.apply_chat_template(m) for m in (turn2, GERMANY))
    shared = next(i for i, (a, b) in enumerate(zip(f_ids, g_ids)) if a != b)
    assert 0 < shared < len(g_ids) - 1
    assert other.usage.prompt_tokens_details.cached_tokens == shared
    again = ask(client, GERMANY, max_tokens=2)  # the identical prompt: all but its last token reused
    assert again.usage.prompt_tokens_details.cached_tokens == again.usage.prompt_tokens - 1
    assert again.choices[0].message.content == other.choices[0].message.content


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
        ask(client, FRANCE, max_tokens=500)  # this run's context is 512 (--context)
    assert e.value.code == "context_length_exceeded" and "context is 512 tokens" in e.value.message
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


def test_default_max_tokens_fits_the_runs_context(client):
    """No max_tokens and --max-tokens 1024 on a --context 512 run: the reply may use what the context leaves
    (it was refused: the worker budgeted with the model's 8192)."""
    r = ask(client, FRANCE, max_tokens=None)
    assert r.choices[0].finish_reason == "stop" and "Paris" in r.choices[0].message.content


MALFORMED = [
    b"[" * 100_000,                                                     # RecursionError in json.loads
    b'{"messages": ' + b"[" * 50_000 + b"]" * 50_000 + b"}",
    {"messages": FRANCE, "seed": -1},                                    # numpy takes no negative seed
    {"messages": FRANCE, "seed": 2**64},
    {"messages": FRANCE, "seed": "1"},
    {"messages": FRANCE, "max_tokens": 2.5},
    {"messages": FRANCE, "temperature": "hot"},
    {"messages": FRANCE, "stop": {"a": 1}},
    {"messages": FRANCE, "stream_options": {"include_usage": "yes"}},
    {"messages": "hello"},
    {"messages": [["user", "hi"]]},
    {"messages": [{"role": "user", "content": 5}]},
    {"messages": [{"role": None, "content": "hi"}]},
    {"prompt": "x", "messages": FRANCE, "model": ["a"]},
    b'{"messages": [{"role": "user", "content": "a\\ud800b"}]}',       # a lone surrogate: not tokenizable
    b'{"messages": [{"role": "user", "content": "hi"}], "temperature": NaN}',
]


def test_malformed_requests_are_4xx_and_keep_the_cache(server, client, france):
    first = ask(client, FRANCE)  # the conversation in the KV cache
    for body in MALFORMED:
        status, ctype, text = http(server, "/v1/chat/completions", body)
        assert 400 <= status < 500 and ctype == "application/json", (body[:60], status, text[:200])
        assert set(json.loads(text)["error"]) == {"message", "type", "param", "code"}
    status, _, text = http(server, "/v1/completions", {"prompt": [[1, 2], [3]]})
    assert status == 400
    again = ask(client, FRANCE)  # nothing reset the cache: all but the last prompt token reused
    assert again.usage.prompt_tokens_details.cached_tokens == first.usage.prompt_tokens - 1
    assert again.choices[0].message.content == france.choices[0].message.content
    assert "Traceback" not in server.errors()


def test_a_20_mb_body_is_413_while_another_chat_is_served(server, client, france):
    from benchmarks.serve import _big_upload

    big: dict = {}
    upload = threading.Thread(target=_big_upload, args=(server.url, 20 << 20, big))
    upload.start()
    other = ask(client, FRANCE)
    upload.join(timeout=120)
    assert not upload.is_alive() and big["status"] == "HTTP/1.1 413 Request Entity Too Large", big
    assert other.choices[0].message.content == france.choices[0].message.content


def test_client_gone_mid_body_is_one_log_line(server, client, france):
    before = len(server.log.read_text())
    host, port = server.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 5000\r\n\r\n{\"mess")
    assert ask(client, FRANCE).choices[0].message.content == france.choices[0].message.content
    server.errors()  # flushes
    lines = [ln for ln in server.log.read_text()[before:].splitlines() if ln.strip()]
    assert len(lines) == 1 and "disconnected while sending its request (6 bytes received)" in lines[0], lines


def test_ctrl_c_ends_a_stream_with_length_and_shuts_down_cleanly(server):
    """Ctrl-C mid-reply: the stream ends with finish_reason "length" (not "stop": the reply did not end by
    itself) and fewer tokens than asked, then [DONE]; the server exits 0."""
    import signal

    c = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=120)
    stream = c.chat.completions.create(model=MODEL, temperature=0, max_tokens=400, stream=True,
                                       stream_options={"include_usage": True}, messages=[
        {"role": "user", "content": "Write a very long story about a dragon who learns to bake bread."}])
    got, finishes, used = 0, [], None
    for ch in stream:
        got += bool(ch.choices and ch.choices[0].delta.content)
        if got == 3 and not finishes:
            server.proc.send_signal(signal.SIGINT)
            got += 1
        finishes += [ch.choices[0].finish_reason] if ch.choices and ch.choices[0].finish_reason else []
        used = ch.usage or used
    assert finishes == ["length"] and used is not None and used.completion_tokens < 400
    code = server.proc.wait(timeout=60)  # the one Ctrl-C above (a second one would be exit 130)
    log = server.errors()
    assert code == 0, log
    assert "Traceback" not in log and "llama-npu serve: stopped" in log
