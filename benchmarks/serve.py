"""`make bench-serve` (also part of `make bench`): `llama-npu serve` with the embedded model on emu, driven by
4 concurrent clients (the official `openai` client, streamed chat requests with short prompts): requests per
minute and time to first token as each client sees it (queueing included), beside one client alone.

`python -m benchmarks.serve --big-body`: the hostile-upload check (docs/serve.md, "Limits"): while one client
sends a 20 MB body, another client's short chat must finish within 2 s of its normal time, and the server's RSS
must come back within 200 MB of its level before; prints the numbers and exits 1 when a target is missed.

ServerProcess starts `llama-npu serve` on a free loopback port; tests/test_serve.py uses it too.
"""
from __future__ import annotations

import argparse
import os
import queue
import re
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
QUESTIONS = ["What is the capital of France?", "What is the capital of Germany?", "Name a primary color.",
             "What is 2 plus 2?", "Say hello.", "What is the largest ocean?", "Name a fruit.",
             "What color is the sky?"]


class ServerProcess:
    """`python -m llama_npu serve --port 0 ...` in a subprocess; `url` is read from the line it prints."""

    def __init__(self, args: list[str], log: Path, env: dict | None = None, timeout: float = 300.0):
        cmd = [sys.executable, "-m", "llama_npu", "serve", "--host", "127.0.0.1", "--port", "0", "--no-progress",
               *args]
        self.log = log
        self._err = open(log, "w")
        self.proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=self._err, text=True,
                                     env=env)
        lines: queue.Queue = queue.Queue()
        threading.Thread(target=lambda: [lines.put(ln) for ln in self.proc.stdout], daemon=True).start()
        try:
            self.line = lines.get(timeout=timeout)
        except queue.Empty:
            self.stop()
            raise RuntimeError(f"llama-npu serve printed nothing in {timeout:.0f} s; log: {self.errors()}")
        m = re.search(r"(http://\S+?)/v1 ", self.line)
        if not m:
            self.stop()
            raise RuntimeError(f"unexpected first line {self.line!r}; log: {self.errors()}")
        self.url = m.group(1)

    def errors(self) -> str:
        if not self._err.closed:
            self._err.flush()
        return self.log.read_text()[-3000:]

    def interrupt(self, timeout: float = 60.0) -> int:
        """Ctrl-C, as a user would press it; returns the exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
        try:
            return self.proc.wait(timeout=timeout)
        finally:
            self._err.close()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self._err.close()


def _one(client, model: str, question: str, max_tokens: int) -> tuple[float, float]:
    """A streamed chat request; returns (time to the first content chunk, total time)."""
    t0 = time.perf_counter()
    ttft = None
    stream = client.chat.completions.create(model=model, messages=[{"role": "user", "content": question}],
                                            max_tokens=max_tokens, temperature=0, stream=True)
    for ch in stream:
        if ttft is None and ch.choices and ch.choices[0].delta.content:
            ttft = time.perf_counter() - t0
    total = time.perf_counter() - t0
    return (ttft if ttft is not None else total), total


def _clients(base_url: str, model: str, n_clients: int, per_client: int, max_tokens: int):
    from openai import OpenAI

    ttfts: list[float] = []
    lock = threading.Lock()

    def client_loop(k: int) -> None:
        client = OpenAI(base_url=base_url, api_key="none", max_retries=0, timeout=600)
        for i in range(per_client):  # the same questions whatever the number of clients
            ttft, _ = _one(client, model, QUESTIONS[(k * per_client + i) % len(QUESTIONS)], max_tokens)
            with lock:
                ttfts.append(ttft)

    threads = [threading.Thread(target=client_loop, args=(k,)) for k in range(n_clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.perf_counter() - t0, ttfts


def bench_serve(n_clients: int = 4, per_client: int = 3, max_tokens: int = 16, model: str | None = None) -> None:
    import tempfile

    env = {k: v for k, v in os.environ.items() if k not in ("MODEL", "DEVICE")}
    with tempfile.TemporaryDirectory() as tmp:
        extra = ["--model", model] if model else []
        srv = ServerProcess(["--device", "emu", "--buckets", "64,256", *extra], Path(tmp) / "serve.log", env=env)
        try:
            from openai import OpenAI

            base = srv.url + "/v1"
            served = OpenAI(base_url=base, api_key="none").models.list().data[0].id
            _clients(base, served, 1, 1, max_tokens)  # warm-up
            wall1, solo = _clients(base, served, 1, n_clients * per_client, max_tokens)
            wall, ttfts = _clients(base, served, n_clients, per_client, max_tokens)
        finally:
            srv.interrupt()
    n = n_clients * per_client
    q = statistics.quantiles(ttfts, n=10) if len(ttfts) > 1 else ttfts * 9
    print(f"[bench] serve, {served} on emu, 1 client: {n * 60 / wall1:.1f} requests/min, "
          f"TTFT median {statistics.median(solo) * 1e3:.0f} ms (short chat prompts, max_tokens {max_tokens})")
    print(f"[bench] serve, {served} on emu, {n_clients} concurrent clients: {n * 60 / wall:.1f} requests/min, "
          f"TTFT median {statistics.median(ttfts) * 1e3:.0f} ms, p90 {q[-1] * 1e3:.0f} ms, "
          f"max {max(ttfts) * 1e3:.0f} ms ({n} requests, served one at a time)")


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc (Linux only)")


def _big_upload(url: str, size: int, out: dict, spread_s: float = 0.0) -> None:
    """POST a `size`-byte JSON chat body on a raw socket (as fast as the server takes it, or spread evenly over
    `spread_s` seconds); out gets the status line and the seconds until it arrived."""
    import socket
    from urllib.parse import urlsplit

    u = urlsplit(url)
    head, tail = b'{"messages": [{"role": "user", "content": "', b'"}], "max_tokens": 1}'
    t0 = time.perf_counter()
    try:
        with socket.create_connection((u.hostname, u.port), timeout=600) as s:
            s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      b"Content-Length: %d\r\n\r\n" % size + head)
            block, left = b"hello " * 10923, size - len(head) - len(tail)
            total = left
            try:
                while left > 0:
                    left -= s.send(block[:min(left, len(block))])
                    if spread_s:
                        time.sleep(max(0.0, t0 + spread_s * (1 - left / total) - time.perf_counter()))
                s.sendall(tail)
            except OSError:
                pass  # the server answered (and closed) before the body was all sent
            out["status"] = s.recv(4096).split(b"\r\n", 1)[0].decode(errors="replace")
    except OSError as e:
        out["status"] = f"connection error: {e}"
    out["seconds"] = time.perf_counter() - t0


def bench_big_body(slack_s: float = 2.0, rss_slack_mb: float = 200.0) -> bool:
    """The hostile-upload check: a 20 MB body sent over 3 s, then a 3.5 MB one (under the default 4 MB limit:
    parsed and tokenized, ~0.6M tokens, refused for the context). True when every target is met."""
    import tempfile

    from openai import OpenAI

    env = {k: v for k, v in os.environ.items() if k not in ("MODEL", "DEVICE")}
    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        srv = ServerProcess(["--device", "emu", "--buckets", "64,256"], Path(tmp) / "serve.log", env=env)
        try:
            client = OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0, timeout=600)
            served = client.models.list().data[0].id

            def chat() -> float:
                t0 = time.perf_counter()
                client.chat.completions.create(model=served, messages=[{"role": "user", "content": QUESTIONS[0]}],
                                               max_tokens=16, temperature=0)
                return time.perf_counter() - t0

            chat()  # warm-up
            normal = statistics.median(chat() for _ in range(3))
            for size_mb, spread in ((20, 3.0), (3.5, 0.0)):
                rss0 = _rss_mb(srv.proc.pid)
                peak, big = [rss0], {}
                upload = threading.Thread(target=_big_upload, args=(srv.url, int(size_mb * (1 << 20)), big, spread))
                upload.start()
                during = [chat()]
                while upload.is_alive() and len(during) < 50:
                    peak.append(_rss_mb(srv.proc.pid))
                    during.append(chat())
                upload.join()
                time.sleep(1.0)
                rss1 = _rss_mb(srv.proc.pid)
                worst = max(during)
                ok_time, ok_rss = worst <= normal + slack_s, rss1 <= rss0 + rss_slack_mb
                ok = ok and ok_time and ok_rss
                print(f"[bench] serve, {size_mb:g} MB body{f' sent over {spread:g} s' if spread else ''}: answered "
                      f"{big.get('status')!r} after {big.get('seconds', 0):.1f} s; a short chat took {normal:.2f} s "
                      f"alone, at most {worst:.2f} s meanwhile ({len(during)} chats; target <= +{slack_s:g} s: "
                      f"{'ok' if ok_time else 'MISSED'}); RSS {rss0:.0f} MB before, peak {max(peak):.0f} MB, "
                      f"{rss1:.0f} MB after (target <= +{rss_slack_mb:g} MB: {'ok' if ok_rss else 'MISSED'})",
                      flush=True)
        finally:
            srv.interrupt()
    return ok


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.serve")
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--requests", type=int, default=3, help="requests per client")
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--model", default=None)
    ap.add_argument("--big-body", action="store_true", help="only the hostile-upload check (20 MB body)")
    args = ap.parse_args(argv)
    if args.big_body:
        return 0 if bench_big_body() else 1
    bench_serve(args.clients, args.requests, args.max_tokens, args.model)
    return 0


if __name__ == "__main__":
    sys.exit(main())
