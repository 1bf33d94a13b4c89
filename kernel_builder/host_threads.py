"""The emulator's thread pool: prefill-sized kernel work split into independent items (attention's kv heads x
row blocks, the GEMM's 64-row blocks) runs on the machine's cores. Every item is computed exactly as it would be
alone (the same calls, the same shapes), so the thread count never changes a result.

LLAMA_NPU_EMU_THREADS sets the worker count (default: the machine's cores, at most 8; 1 runs everything on the
calling thread). The pool's threads do not spin: on a busy machine they only share the cores.
"""
from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor, wait
from typing import Callable, Iterable

_lock = threading.Lock()
_pools: dict[int, ThreadPoolExecutor] = {}
_CORES = max(1, min(8, os.cpu_count() or 1))


def _after_fork() -> None:
    """A forked child has none of the pools' worker threads: forget the pools (new ones start on demand)."""
    global _lock
    _lock = threading.Lock()
    _pools.clear()


os.register_at_fork(after_in_child=_after_fork)


def threads() -> int:
    env = os.environ.get("LLAMA_NPU_EMU_THREADS")
    if env:
        try:
            return max(1, int(env))
        except ValueError:
            raise ValueError(f"LLAMA_NPU_EMU_THREADS={env!r} is not a number") from None
    return _CORES


def run_items(fn: Callable, items: Iterable, parallel: bool = True) -> None:
    """fn(item) for every item: on the pool when `parallel` and more than one worker, else in order here.
    The first exception raised by an item is raised here (after the others finish)."""
    items = list(items)
    n = threads() if parallel and len(items) > 1 else 1     # (decode-sized calls skip the lookup)
    if n == 1:
        for item in items:
            fn(item)
        return
    with _lock:
        pool = _pools.get(n)
        if pool is None:
            pool = _pools[n] = ThreadPoolExecutor(max_workers=n, thread_name_prefix="llama-npu-emu")
    futures = [pool.submit(fn, item) for item in items]
    wait(futures)                     # every item done before anything is raised: no writer left running
    for f in futures:
        f.result()
