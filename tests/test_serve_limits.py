"""`llama-npu serve`'s limits on what one connection may send, on the real HTTP stack (server.create_app and
serve_limits' uvicorn config, in this process on 127.0.0.1) with a stand-in worker, so no model loads and the
timeouts can be short: the body limit (413 in OpenAI's format, decided while reading), header and body read
timeouts, a client that disconnects mid-body (one log line), deeply nested JSON (400) and an unexpected
exception (an OpenAI-format 500 and one log line, no traceback). Raw sockets, every read with a timeout.
The same cases against the real server (and the timing targets) are in tests/test_serve.py and
`python -m benchmarks.serve --big-body`."""
from __future__ import annotations

import json
import socket
import threading
import time
from concurrent.futures import Future

import pytest

from llama_npu.serve_limits import ServeLimits, uvicorn_config
from llama_npu.serve_worker import Job, Outcome
from tooling import require_module

openai = require_module("openai")
uvicorn = require_module("uvicorn")

MODEL = "stub-model"
LIMITS = ServeLimits(max_body_bytes=64 * 1024, header_timeout_s=1.0, body_idle_timeout_s=1.0, body_timeout_s=3.0,
                     keep_alive_s=1, drain_s=3.0)
CHAT = b'{"messages": [{"role": "user", "content": "hi"}]}'


class StubWorker:
    """The EngineWorker calls the app makes, answering "ok" at once; `fail` makes prepare() raise."""
    model_id = MODEL
    fail: Exception | None = None

    def prepare(self, req) -> Job:
        if self.fail is not None:
            raise self.fail
        return Job(req, [1, 2, 3], 4)

    def submit(self, job: Job, emit=None) -> Future:
        fut: Future = Future()
        if emit is not None:
            emit("ok")
        fut.set_result(Outcome("ok", "stop", 3, 1))
        return fut

    def health(self) -> dict:
        return {"pending": 0}


@pytest.fixture(scope="module")
def stub():
    from llama_npu.server import create_app, listen

    worker = StubWorker()
    sock = listen("127.0.0.1", 0)
    config = uvicorn_config(create_app(worker, LIMITS), LIMITS, log_level="warning", access_log=False,
                            lifespan="off")
    http = uvicorn.Server(config)
    thread = threading.Thread(target=http.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not http.started and time.monotonic() < deadline:
        time.sleep(0.02)
    assert http.started
    yield worker, sock.getsockname()[1]
    http.should_exit = True
    thread.join(timeout=10)
    sock.close()


def connect(port: int) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    s.settimeout(10)
    return s


def head(length: int | None, extra: str = "") -> bytes:
    size = f"Content-Length: {length}\r\n" if length is not None else "Transfer-Encoding: chunked\r\n"
    return (f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n{size}{extra}\r\n"
            .encode())


def read_response(s: socket.socket) -> tuple[int, dict, bytes]:
    """Status, headers (lower-case names) and body of one response with a Content-Length."""
    data = b""
    while b"\r\n\r\n" not in data:
        got = s.recv(65536)
        assert got, f"connection closed before a response: {data!r}"
        data += got
    top, body = data.split(b"\r\n\r\n", 1)
    lines = top.decode().split("\r\n")
    headers = dict(ln.split(": ", 1) for ln in lines[1:])
    headers = {k.lower(): v for k, v in headers.items()}
    while len(body) < int(headers.get("content-length", 0)):
        got = s.recv(65536)
        assert got
        body += got
    return int(lines[0].split()[1]), headers, body


def closed_within(s: socket.socket, seconds: float) -> float:
    """Seconds until the server closes the connection (fails after `seconds`)."""
    t0 = time.monotonic()
    s.settimeout(seconds)
    while True:
        try:
            if not s.recv(65536):
                return time.monotonic() - t0
        except ConnectionResetError:
            return time.monotonic() - t0
        except socket.timeout:
            pytest.fail(f"the server kept the connection open for {seconds} s")


def openai_error(body: bytes) -> dict:
    err = json.loads(body)["error"]
    assert set(err) == {"message", "type", "param", "code"}
    return err


def test_a_normal_request_passes(stub):
    _, port = stub
    with connect(port) as s:
        s.sendall(head(len(CHAT)) + CHAT)
        status, _, body = read_response(s)
    assert status == 200 and json.loads(body)["choices"][0]["message"]["content"] == "ok"


def test_oversized_body_is_413_for_the_official_client(stub):
    _, port = stub
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0, timeout=30)
    with pytest.raises(openai.APIStatusError) as e:
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "a" * (2 << 20)}])
    assert e.value.status_code == 413 and e.value.code == "request_too_large"
    assert "0.0625 MB" in e.value.message and "--max-body-mb" in e.value.message
    ok = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}])
    assert ok.choices[0].message.content == "ok"


def test_chunked_body_is_cut_at_the_limit_while_reading(stub):
    """No Content-Length: the bytes are counted as they come; the 413 arrives although the client has not
    finished (it never does), and the connection is closed."""
    _, port = stub
    with connect(port) as s:
        s.sendall(head(None))
        piece = b"a" * 16384
        chunk = b"%x\r\n%s\r\n" % (len(piece), piece)
        for _ in range(5):  # 80 KiB > 64 KiB, no terminating chunk
            s.sendall(chunk)
        status, headers, body = read_response(s)
        assert status == 413 and headers.get("connection") == "close"
        assert openai_error(body)["type"] == "invalid_request_error"


def test_declared_oversize_with_expect_100_is_refused_before_the_body(stub):
    _, port = stub
    with connect(port) as s:
        s.sendall(head(20 << 20, "Expect: 100-continue\r\n"))
        status, _, body = read_response(s)  # no byte of the body was sent
    assert status == 413 and openai_error(body)["code"] == "request_too_large"


def test_unfinished_headers_time_out(stub, capfd):
    _, port = stub
    with connect(port) as idle, connect(port) as partial:
        partial.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")
        for s in (idle, partial):
            assert closed_within(s, LIMITS.header_timeout_s + 3) < LIMITS.header_timeout_s + 3
    time.sleep(0.1)
    err = capfd.readouterr().err
    assert "did not send complete request headers within 1 s; closed" in err and "Traceback" not in err


def test_stalled_or_trickled_body_gets_408(stub, capfd):
    _, port = stub
    with connect(port) as s:  # stops after 10 of 100 bytes
        s.sendall(head(100) + CHAT[:10])
        t0 = time.monotonic()
        status, headers, body = read_response(s)
        assert status == 408 and headers.get("connection") == "close"
        assert openai_error(body)["code"] == "request_timeout"
        assert time.monotonic() - t0 < LIMITS.body_idle_timeout_s + 2
    with connect(port) as s:  # one byte every 0.5 s: never idle for 1 s, but over the 3 s in all
        s.sendall(head(100))
        t0 = time.monotonic()
        s.settimeout(0.5)
        status = None
        for i in range(20):
            try:
                s.sendall(b" ")
                status, _, _ = read_response(s)
                break
            except socket.timeout:
                continue
        assert status == 408 and time.monotonic() - t0 < LIMITS.body_timeout_s + 2
    assert "sent its request body too slowly" in capfd.readouterr().err


def test_disconnect_mid_body_is_one_log_line(stub, capfd):
    _, port = stub
    capfd.readouterr()
    with connect(port) as s:
        s.sendall(head(1000) + CHAT[:20])
        time.sleep(0.2)
    time.sleep(0.5)
    lines = [ln for ln in capfd.readouterr().err.splitlines() if ln.strip()]
    assert len(lines) == 1 and "disconnected while sending its request (20 bytes received)" in lines[0], lines


@pytest.mark.parametrize("raw", [b"[" * 60_000, b'{"messages": ' + b"[" * 30_000 + b"]" * 30_000 + b"}"])
def test_deeply_nested_json_is_400(stub, raw):
    _, port = stub
    with connect(port) as s:
        s.sendall(head(len(raw)) + raw)
        status, _, body = read_response(s)
    assert status == 400 and "nested too deeply" in openai_error(body)["message"]


def test_an_unexpected_exception_is_an_openai_500_and_one_line(stub, capfd):
    worker, port = stub
    capfd.readouterr()
    worker.fail = RuntimeError("boom\nsecond line")
    try:
        with connect(port) as s:
            s.sendall(head(len(CHAT)) + CHAT)
            status, _, body = read_response(s)
    finally:
        worker.fail = None
    assert status == 500 and openai_error(body)["type"] == "server_error"
    time.sleep(0.1)
    lines = [ln for ln in capfd.readouterr().err.splitlines() if ln.strip()]
    assert len(lines) == 1 and "RuntimeError: boom" in lines[0], lines


def test_least_tokens_is_a_lower_bound_of_the_real_count():
    """The pre-check that refuses megabytes of text without tokenizing must never refuse a prompt that fits:
    its bound stays at or below the real token count, on text built to pack many bytes into few tokens."""
    import random

    from llama_npu.model_source import resolve_model
    from llama_npu.serve_limits import least_tokens, max_token_bytes
    from llama_npu.tokenizer import Tokenizer

    tok = Tokenizer(resolve_model(None, progress=False))
    per = max_token_bytes(tok)
    assert 8 <= per <= 256
    rng = random.Random(0)
    longest = max(range(tok.vocab_size), key=lambda i: len(tok.decode([i], skip_special_tokens=False).encode()))
    pieces = [tok.decode([longest], skip_special_tokens=False), " " * 64, "\n" * 40, "hello ", "é", "🙂", "的",
              "<|im_end|>", "a\ud800b", "=" * 80, "-" * 100]
    for _ in range(200):
        text = "".join(rng.choice(pieces) * rng.randint(1, 30) for _ in range(rng.randint(1, 8)))
        try:
            real = len(tok.encode(text, add_special_tokens=False))
        except TypeError:  # a lone surrogate: not tokenizable (the server's 400)
            continue
        assert least_tokens([text], per) <= real, (text[:80], real)
    assert least_tokens(["hello " * 700_000], per) > 8192  # 4.2 MB: refused without tokenizing
