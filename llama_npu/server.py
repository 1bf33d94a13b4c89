"""`llama-npu serve`: the OpenAI-compatible HTTP API, a Starlette app served by uvicorn.

Routes: GET /v1/models, GET /v1/models/{id}, POST /v1/chat/completions, POST /v1/completions, GET /health.
The body is read within the limits of serve_limits (size, timeouts); it is parsed, validated and tokenized
on a worker thread (never on the event loop), then queued to the one engine thread
(serve_worker.EngineWorker); streamed text reaches the client as server-sent events in OpenAI's chunk
format. See docs/serve.md.
"""
from __future__ import annotations

import asyncio
import socket
import sys
import time

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from .errors import LlamaNpuError
from .serve_api import (ApiError, chunk, model_card, new_id, parse_chat, parse_completion, parse_json,
                        response, sse, usage)
from .serve_limits import ServeLimits, read_body, uvicorn_config
from .serve_worker import EngineWorker, Job, Outcome

DISCONNECT_POLL_S = 0.25  # how often a waiting non-streamed request checks that its client is still there


class ServeError(LlamaNpuError):
    """The HTTP side could not run."""


def _finish(outcome: Outcome) -> str:
    """The OpenAI finish_reason: "stop" (end of turn, stop string) or "length". A reply cut short because the
    server shuts down (Ctrl-C) is "length" too, the one OpenAI value for a reply that did not end by itself;
    its completion_tokens is below max_tokens (a client that left never sees its reply)."""
    return "length" if outcome.finish_reason == "interrupted" else outcome.finish_reason


def _server_error(e: BaseException) -> ApiError:
    text = (str(e).strip() or type(e).__name__).splitlines()[0]
    print(f"llama-npu serve: error: {text}", file=sys.stderr, flush=True)
    return ApiError(500, f"generation failed: {text}", code="engine_error")


class _JobStream(StreamingResponse):
    """An SSE response whose job is stopped whenever the response ends: normally (a no-op), or because
    the client disconnected (Starlette cancels the stream), which frees the engine for the next request."""

    def __init__(self, content, job: Job):
        super().__init__(content, media_type="text/event-stream",
                         headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        self.job = job

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.job.stop.set()


async def _complete(worker: EngineWorker, request: Request, job: Job) -> JSONResponse:
    fut = asyncio.wrap_future(worker.submit(job))
    while not fut.done():
        await asyncio.wait({fut}, timeout=DISCONNECT_POLL_S)
        if not fut.done() and await request.is_disconnected():
            job.stop.set()  # nobody will read the answer: stop (or skip) the generation
    try:
        out = fut.result()
    except Exception as e:
        raise _server_error(e) from None
    return JSONResponse(response(job.req, new_id(job.req.kind), out.text, _finish(out),
                                 usage(out.prompt_tokens, out.completion_tokens, out.cached_tokens),
                                 out.tool_calls, out.logprobs))


async def _events(worker: EngineWorker, job: Job):
    req, loop = job.req, asyncio.get_running_loop()
    rid, t = new_id(req.kind), int(time.time())
    queue: asyncio.Queue = asyncio.Queue()

    def put(item) -> None:  # from the engine thread
        try:
            loop.call_soon_threadsafe(queue.put_nowait, item)
        except RuntimeError:  # the event loop is gone (server shut down)
            pass

    fut = worker.submit(job, emit=put)
    fut.add_done_callback(lambda _f: put(None))  # after every emitted delta
    if req.kind == "chat":
        yield sse(chunk(req, rid, t, role=True))
    while (delta := await queue.get()) is not None:
        yield sse(chunk(req, rid, t, delta=delta))
    try:
        out = fut.result()
    except Exception as e:
        yield sse(_server_error(e).body())
    else:
        yield sse(chunk(req, rid, t, finish=_finish(out)))
        if req.include_usage:
            yield sse(chunk(req, rid, t, u=usage(out.prompt_tokens, out.completion_tokens, out.cached_tokens)))
    yield sse("[DONE]")


async def _api_error(_request: Request, e: ApiError) -> JSONResponse:
    return JSONResponse(e.body(), status_code=e.status, headers=getattr(e, "headers", None))


async def _internal_error(_request: Request, e: Exception) -> JSONResponse:  # logged by serve_limits.catch_all
    err = ApiError(500, f"internal error: {type(e).__name__}")
    return JSONResponse(err.body(), status_code=500, headers={"Connection": "close"})


async def _http_error(_request: Request, e: HTTPException) -> JSONResponse:  # unknown path, wrong method
    err = ApiError(e.status_code, str(e.detail), code="not_found" if e.status_code == 404 else None)
    return JSONResponse(err.body(), status_code=e.status_code, headers=getattr(e, "headers", None))


def create_app(worker: EngineWorker, limits: ServeLimits = ServeLimits()) -> Starlette:
    created = int(time.time())
    card = model_card(worker.model_id, created)

    async def list_models(_request: Request) -> JSONResponse:
        return JSONResponse({"object": "list", "data": [card]})

    async def get_model(request: Request) -> JSONResponse:
        name = request.path_params["model"]
        if name != worker.model_id:
            raise ApiError(404, f"the model '{name}' does not exist; this server serves '{worker.model_id}'",
                           "model", "model_not_found")
        return JSONResponse(card)

    async def health(_request: Request) -> JSONResponse:
        return JSONResponse({"status": "ok", "model": worker.model_id, **worker.health()})

    async def chat_completions(request: Request):
        return await _generate(request, parse_chat)

    async def completions(request: Request):
        return await _generate(request, parse_completion)

    def _prepare(raw: bytes, parse) -> Job:  # on a worker thread: JSON, validation, template, tokenizer
        return worker.prepare(parse(parse_json(raw), worker.model_id))

    async def _generate(request: Request, parse):
        job = await run_in_threadpool(_prepare, await read_body(request, limits), parse)
        req = job.req
        return _JobStream(_events(worker, job), job) if req.stream else await _complete(worker, request, job)

    routes = [
        Route("/v1/models", list_models, methods=["GET"]),
        Route("/v1/models/{model:path}", get_model, methods=["GET"]),
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/health", health, methods=["GET"]),
    ]
    return Starlette(routes=routes, exception_handlers={ApiError: _api_error, HTTPException: _http_error,
                                                        Exception: _internal_error})


def model_id(arg: str | None, model_dir) -> str:
    """The name clients use in `model`: what --model said (an HF id), the directory's name for a path,
    or the embedded model's name."""
    from pathlib import Path

    from .embedded import EMBEDDED_NAME
    from .model_source import EMBEDDED_ALIASES

    text = (arg or "").strip()
    if text.lower() in EMBEDDED_ALIASES:
        return EMBEDDED_NAME
    path = Path(text).expanduser()
    return path.resolve().name if path.is_dir() else text


def listen(host: str, port: int) -> socket.socket:
    """The listening socket, bound before the model loads so a busy port fails at once. Raises OSError."""
    return socket.create_server((host, port), family=socket.AF_INET6 if ":" in host else socket.AF_INET,
                                backlog=128, reuse_port=False)


def url_of(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def run(worker: EngineWorker, sock: socket.socket, limits: ServeLimits = ServeLimits()) -> None:
    """Serve until Ctrl-C / SIGTERM. HTTP (uvicorn's event loop) runs on a thread; this thread, which
    loaded the engine, runs the generations. On Ctrl-C every queued or running generation stops after
    its current token, open streams end, and uvicorn shuts down; a second Ctrl-C raises KeyboardInterrupt."""
    import signal
    import threading

    import uvicorn

    config = uvicorn_config(create_app(worker, limits), limits, log_level="warning", access_log=False,
                            lifespan="off", timeout_graceful_shutdown=5)
    http = uvicorn.Server(config)  # off the main thread it installs no signal handlers of its own
    thread = threading.Thread(target=http.run, kwargs={"sockets": [sock]}, name="llama-npu-http", daemon=True)
    stop = threading.Event()

    def on_signal(_signum, _frame) -> None:
        if stop.is_set():
            raise KeyboardInterrupt
        stop.set()
        worker.stop_all()
        http.should_exit = True

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    thread.start()
    try:
        worker.serve_forever(done=lambda: stop.is_set() or not thread.is_alive())
    finally:
        http.should_exit = True
        worker.close()
        thread.join(timeout=config.timeout_graceful_shutdown + 5)
        for s, handler in previous.items():
            signal.signal(s, handler)
    if not stop.is_set():
        raise ServeError("the HTTP server stopped unexpectedly (see the messages above)")
