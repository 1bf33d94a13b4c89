"""What `llama-npu serve` accepts from one connection, and for how long: the body size limit (413), the header
and body read timeouts, the request line / header size limit, and the last-resort handler that turns any
unexpected exception into one log line and an OpenAI-style 500 (never a traceback, never a bare text 500).
See docs/serve.md, "Limits and timeouts".

The header timeout lives in the HTTP protocol (a subclass of uvicorn's h11 protocol, since uvicorn only
times out idle keep-alive connections); everything about the body is read by the app itself (read_body).
"""
from __future__ import annotations

import asyncio
import json
import sys
import time
from dataclasses import dataclass

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from .serve_api import ApiError

MB = 1 << 20


@dataclass(frozen=True)
class ServeLimits:
    max_body_bytes: int = 4 * MB        # --max-body-mb; larger bodies get 413
    header_timeout_s: float = 10.0      # request line + headers complete within this, from their first byte
    body_idle_timeout_s: float = 10.0   # at most this between two pieces of the body
    body_timeout_s: float = 60.0        # the whole body within this
    keep_alive_s: int = 5               # an idle keep-alive connection is closed after this (uvicorn)
    max_header_bytes: int = 16 * 1024   # request line + headers (h11); beyond: 400 and close
    drain_bytes: int = 256 * MB         # an oversized body is read and dropped up to this, so the client
    drain_s: float = 5.0                # sees the 413 (not a reset); beyond either: 413 and close


def max_token_bytes(tokenizer) -> int:
    """The most UTF-8 bytes one token of the vocabulary decodes to (a lone byte shows as U+FFFD, 3 bytes: an
    over-estimate, which only weakens least_tokens). ~0.2 s for a 49k vocabulary, once at start."""
    ids = range(tokenizer.vocab_size)
    return max((len(tokenizer.decode([i], skip_special_tokens=False).encode()) for i in ids), default=1) or 1


def least_tokens(texts: list[str], token_bytes: int) -> int:
    """A lower bound on the tokens `texts` become (each token covers at most `token_bytes` of their bytes, one
    may straddle each text's ends): a prompt that cannot fit the context is refused without tokenizing it."""
    n = sum(len(t.encode("utf-8", "surrogatepass")) for t in texts)
    return max(0, n // token_bytes - 2 * len(texts))


def log(text: str) -> None:
    print(f"llama-npu serve: {text}", file=sys.stderr, flush=True)


class ClientGone(Exception):
    """The client disconnected before its request was read: nobody to answer."""


def too_large(limits: ServeLimits) -> ApiError:
    return ApiError(413, f"the request body is larger than the server's limit of {limits.max_body_bytes / MB:g} MB "
                         "(llama-npu serve --max-body-mb)", code="request_too_large")


def _peer(scope) -> str:
    client = scope.get("client")
    return f"{client[0]}:{client[1]}" if client else "a client"


async def _next(receive, deadline: float, limits: ServeLimits) -> dict:
    left = min(limits.body_idle_timeout_s, deadline - time.monotonic())
    if left <= 0:
        raise asyncio.TimeoutError
    return await asyncio.wait_for(receive(), timeout=left)


async def _drain(receive, got: int, limits: ServeLimits) -> bool:
    """Read and drop the rest of an oversized body (bounded); True when it ended (the connection may stay)."""
    deadline = time.monotonic() + min(limits.drain_s, limits.body_timeout_s)
    try:
        while got <= limits.drain_bytes:
            msg = await _next(receive, deadline, limits)
            if msg["type"] != "http.request":
                return False
            got += len(msg.get("body", b""))
            if not msg.get("more_body", False):
                return True
    except asyncio.TimeoutError:
        pass
    return False


async def read_body(request, limits: ServeLimits) -> bytes:
    """The request body, read piece by piece: ApiError 413 as soon as it passes the limit (declared or
    counted), 408 when it stalls or takes too long, ClientGone (one log line) when the client disconnects."""
    declared = request.headers.get("content-length")
    size = int(declared) if declared and declared.isdigit() else None
    scope, receive = request.scope, request.receive
    if size is not None and size > limits.max_body_bytes:
        if request.headers.get("expect", "").lower() == "100-continue" or size > limits.drain_bytes:
            raise _closing(too_large(limits))  # the body was not sent yet, or is not worth reading
        ended = await _drain(receive, 0, limits)
        raise too_large(limits) if ended else _closing(too_large(limits))
    parts, got = [], 0
    deadline = time.monotonic() + limits.body_timeout_s
    try:
        while True:
            msg = await _next(receive, deadline, limits)
            if msg["type"] == "http.disconnect":
                log(f"{_peer(scope)} disconnected while sending its request ({got} bytes received)")
                raise ClientGone
            body = msg.get("body", b"")
            got += len(body)
            if got > limits.max_body_bytes:
                parts.clear()
                ended = await _drain(receive, got, limits)
                raise too_large(limits) if ended else _closing(too_large(limits))
            parts.append(body)
            if not msg.get("more_body", False):
                return b"".join(parts)
    except asyncio.TimeoutError:
        log(f"{_peer(scope)} sent its request body too slowly ({got} bytes received); closed")
        raise _closing(ApiError(408, f"the request body did not arrive in time ({got} bytes in "
                                     f"{limits.body_timeout_s:g} s, or a pause over {limits.body_idle_timeout_s:g} s)",
                                code="request_timeout")) from None


def _closing(e: ApiError) -> ApiError:
    e.headers = {"Connection": "close"}  # the rest of the body is not read: the connection cannot be reused
    return e


class Protocol(H11Protocol):
    """uvicorn's h11 protocol plus a header timeout: the request line and headers must be complete within
    header_timeout_s of the connection opening (or of the first byte of the next request on a kept-alive
    connection); otherwise the connection is closed. uvicorn's own timeout covers only idle keep-alive."""

    limits = ServeLimits()

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self._got_bytes = False
        self._header_timer = self.loop.call_later(self.limits.header_timeout_s, self._header_timeout)

    def data_received(self, data: bytes) -> None:
        self._got_bytes = True
        super().data_received(data)
        waiting = self.conn.their_state is h11.IDLE and self.conn.our_state is h11.IDLE
        timer = getattr(self, "_header_timer", None)
        if waiting and timer is None:
            self._header_timer = self.loop.call_later(self.limits.header_timeout_s, self._header_timeout)
        elif not waiting and timer is not None:
            timer.cancel()
            self._header_timer = None

    def connection_lost(self, exc) -> None:
        timer = getattr(self, "_header_timer", None)
        if timer is not None:
            timer.cancel()
        super().connection_lost(exc)

    def _header_timeout(self) -> None:
        self._header_timer = None
        if not self.transport.is_closing() and self.conn.their_state is h11.IDLE:
            if self._got_bytes:  # a connection that sent nothing (a browser's pre-connect) closes silently
                client = f"{self.client[0]}:{self.client[1]}" if self.client else "a client"
                log(f"{client} did not send complete request headers within {self.limits.header_timeout_s:g} s; "
                    "closed")
            self.transport.close()


def protocol_for(limits: ServeLimits) -> type:
    return type("LimitedH11Protocol", (Protocol,), {"limits": limits})


def uvicorn_config(app, limits: ServeLimits, **kw):
    import uvicorn

    return uvicorn.Config(catch_all(app), http=protocol_for(limits), timeout_keep_alive=limits.keep_alive_s,
                          h11_max_incomplete_event_size=limits.max_header_bytes, **kw)


def catch_all(app):
    """ASGI wrapper: an exception that escapes the app is one log line and, when no response has started,
    a 500 in OpenAI's error format (uvicorn would log a traceback and answer in plain text)."""
    async def wrapped(scope, receive, send):
        started = False

        async def tracking_send(message):
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await app(scope, receive, tracking_send)
        except ClientGone:
            return
        except Exception as e:
            text = (str(e).strip() or type(e).__name__).splitlines()[0]
            log(f"error: {scope.get('method', '')} {scope.get('path', '')}: {type(e).__name__}: {text}")
            if scope["type"] != "http" or started:
                return
            body = json.dumps(ApiError(500, f"internal error: {type(e).__name__}").body()).encode()
            await send({"type": "http.response.start", "status": 500,
                        "headers": [(b"content-type", b"application/json"), (b"connection", b"close")]})
            await send({"type": "http.response.body", "body": body})
    return wrapped
