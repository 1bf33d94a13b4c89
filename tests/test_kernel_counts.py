"""The instruction counts the cost model charges per external call (each kernel's descriptor in
kernel_builder/<kind>/external.py, formulas in its loop bounds: kernel_builder.instr_counts) equal what the host
aie_api counts when it runs the kernel's AIE2P path, call by call, at every object the builders link for SmolLM2,
Llama-3.2-1B and 3B (the drivers of kernel_builder.aie_host_runs: every entry point, the GEMV's K chunks, the
attention's Q and K/V items at and past the causal bound, the decode shares and the merge). An edit of a kernel's
loops changes the host counts, and this test fails until the descriptor follows (docs/hardware-model.md,
"Counted compute")."""
from __future__ import annotations

import numpy as np
import pytest

from kernel_builder import aie_host
from kernel_builder import aie_host_runs as runs
from kernel_builder.external_costs import external_cost
from kernel_builder.instr_counts import KINDS, Counts
from tests.test_aie_host_kernels import OBJECTS
from tests.tooling import require_tool


def recorded_calls(obj: str, lib=None, pos=None) -> list[tuple[str, list, dict]]:
    """Every call the object's driver makes: (symbol, operands with arrays as None, host counts)."""
    calls = []
    orig = aie_host.AieHostLibrary.call

    def call(self, symbol, *args):
        c = orig(self, symbol, *args)
        calls.append((symbol, [int(a) if isinstance(a, (int, np.integer)) else None for a in args], c))
        return c

    aie_host.AieHostLibrary.call = call
    try:
        name, params = runs.family(obj)
        lib = lib or aie_host.load(runs.kernel_of(obj))
        rng = np.random.default_rng(7)
        if pos is not None and name == "attention":
            mode, hd, lq, lk, n, window, scale_dim = params
            if mode == "p":
                runs._prefill(lib, rng, hd, lq, lk, n, pos=pos, window=window, scale_dim=scale_dim)
            else:
                runs._decode(lib, rng, hd, lq, lk, n, pos=pos, window=window, scale_dim=scale_dim)
        else:
            runs.run(obj, rng, lib)
    finally:
        aie_host.AieHostLibrary.call = orig
    return calls


def descriptor_counts(symbol: str, operands: list) -> dict:
    ec = external_cost(symbol)
    assert ec is not None, f"no cost descriptor for {symbol}"
    return Counts(**ec[0].work(ec[1], operands).counts).host()


def _check(obj, calls):
    for symbol, operands, host in calls:
        want = {k: v for k, v in host.items() if v}
        got = descriptor_counts(symbol, operands)
        assert got == want, (f"{obj} {symbol}{tuple(operands)}: descriptor counts differ from the host aie_api: "
                             + ", ".join(f"{k} {got.get(k, 0)} vs {want.get(k, 0)}"
                                         for k in sorted(set(got) | set(want)) if got.get(k, 0) != want.get(k, 0)))


@pytest.fixture(scope="module", autouse=True)
def built():
    require_tool("g++")
    aie_host.build_all([runs.kernel_of(o) for o in OBJECTS])


def test_kinds_are_the_host_kinds():
    lib = aie_host.load(runs.kernel_of("add_n256.o"))
    assert tuple(lib.kinds) == KINDS


@pytest.mark.parametrize("obj", OBJECTS)
def test_descriptor_counts_equal_host_counts(obj):
    calls = recorded_calls(obj)
    assert calls
    _check(obj, calls)


@pytest.mark.parametrize("obj", ["attnp_hd64_q32_k32_n8.o", "attnp_hd128_q16_k16_n4.o", "attnp_hd64_q64_k32_n8.o",
                                 "attnd_hd64_q3_k64_n4.o", "attnd_hd128_q3_k32_n4.o", "attnd_hd64_q3_k64_n4_w100.o",
                                 "attnd_hd64_q4_k16_n2_w24.o", "attnd_hd96_q3_k64_n4.o",
                                 "attnd_hd256_q4_k16_n2_w24_s128.o"])
def test_attention_counts_at_causal_edges(obj):
    """Positions where the causal bound cuts a tile, lands on its edge, or leaves decode shares empty; with a
    sliding window (decode _w), where the window's first key cuts a tile (mid-chunk, on a 16-key chunk edge) or
    leaves a tile before it (the windowed step counts only the keys it computes); head dims 96 (Phi-4-mini: an
    odd number of 32-lane chunks, so the p.V pass takes one) and 256 (Gemma 3)."""
    name, (mode, hd, lq, lk, n, window, _) = runs.family(obj)
    extra = (window + 7, window + 16, window + lk, 2 * window + 3) if window else ()
    for pos in (0, 1, lk - 1, lk + 1, 3 * lk - 5, *extra):
        _check(f"{obj} pos {pos}", recorded_calls(obj, pos=pos % (2 * lk * n) if mode == "d" else pos))
