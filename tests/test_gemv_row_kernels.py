"""GEMV, RMSNorm, add, SwiGLU and RoPE: emu-interp at reduced shapes against the numpy references, mutations a
test must catch (a wrong DMA offset changes the interpreter's result or fails it out of bounds), and the
data-movement rules the builders keep at every reference shape (offsets affine - no div/rem -, every L3 load of a
multi-tile herd inside the loop that reads it, buffers an external call writes allocated outside the loops and
kept there, 4-byte transfers, even trip counts)."""
from __future__ import annotations

import math
import re

import numpy as np
import pytest

from kernel_builder import planner
from kernel_builder.add import builder as add
from kernel_builder.gemv import builder as gemv, plan as gemv_plan
from kernel_builder.numerics import BF16
from kernel_builder.reference import KERNELS
from kernel_builder.rmsnorm import builder as rmsnorm, plan as rmsnorm_plan
from kernel_builder.rope import builder as rope
from kernel_builder.swiglu import builder as swiglu, plan as swiglu_plan
from llama_npu.models.llama import LLAMA32_1B, LLAMA32_3B, SMOLLM2_135M, LlamaModel
from llama_npu.rope import rope_lut
from multi_launch_builder.emulator import air_interp

ULPS = 2


def _rand(rng, shape, scale=0.5):
    return (rng.standard_normal(math.prod(shape)) * scale).astype(np.float32).astype(BF16).reshape(shape)


def _inputs(kind: str, params: dict, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    if kind == "gemv":
        m, k = params["m"], params["k"]
        return [_rand(rng, (m, k), 0.05), _rand(rng, (1, k)), np.zeros((1, m), BF16)]
    if kind == "rmsnorm":
        rows, dim, g = params["rows"], params["dim"], params.get("group", 0) or params["dim"]
        return [_rand(rng, (rows, dim), 2.0), _rand(rng, (g,)), np.zeros((rows, dim), BF16)]
    if kind == "rope":
        rows, heads, hd = params["rows"], params["heads"], params["head_dim"]
        lut = rope_lut(np.arange(rows) + 3, hd, 10000.0)
        return [_rand(rng, (rows, heads * hd), 2.0), lut, np.zeros((rows, heads * hd), BF16)]
    rows, dim = params["rows"], params["dim"]
    out = (rows * dim,) if params.get("flat_out") else (rows, dim)
    return [_rand(rng, (rows, dim), 4.0), _rand(rng, (rows, dim)), np.zeros(out, BF16)]


def _interp(text: str, data: list[np.ndarray]) -> tuple[np.ndarray, air_interp.Stats]:
    args = [a.copy() for a in data]
    stats = air_interp.compile_module(text).run(args)
    return args[-1].astype(np.float32), stats


def _reference(kind: str, params: dict, data: list[np.ndarray]) -> np.ndarray:
    return np.asarray(KERNELS[kind](*data[:-1], **params)).astype(np.float32).reshape(data[-1].shape)


def _assert_close(got, want, what):
    scale = float(np.abs(want).max())
    tol = ULPS * 2.0 ** (math.floor(math.log2(scale)) - 7) if scale else 0.0
    assert np.isfinite(got).all(), f"{what}: non-finite output"
    err = float(np.abs(got - want).max())
    assert err <= tol, f"{what}: differs by {err} (> {ULPS} bf16 ulps of {scale})"


# ------------------------------------------------------------------------------- reduced shapes vs reference

CASES = [
    # GEMV ([8, 2] herd unless m is small): one step per tile / several row blocks / K chunks (f32 partial sums)
    # and rows together / a [5, 2] herd / a one-row [4, 1] herd
    ("gemv", dict(m=64, k=96), lambda: gemv.build(64, 96)),
    ("gemv", dict(m=512, k=640), lambda: gemv.build(512, 640)),
    ("gemv", dict(m=32, k=16384), lambda: gemv.build(32, 16384)),
    ("gemv", dict(m=20, k=64), lambda: gemv.build(20, 64)),
    ("gemv", dict(m=8, k=64), lambda: gemv.build(8, 64)),
    # RMSNorm: rows over 8 tiles with several steps, decode (one tile, one row), per-head groups
    ("rmsnorm", dict(rows=64, dim=576, eps=1e-5), lambda: rmsnorm.build(64, 576, 1e-5)),
    ("rmsnorm", dict(rows=1, dim=576, eps=1e-5), lambda: rmsnorm.build(1, 576, 1e-5)),
    ("rmsnorm", dict(rows=4, dim=256, eps=1e-6, group=32), lambda: rmsnorm.build(4, 256, 1e-6, 32)),
    ("rmsnorm", dict(rows=1, dim=2048, eps=1e-5, group=64), lambda: rmsnorm.build(1, 2048, 1e-5, 64)),
    # elementwise, flattened to 1-D: several chunks per tile, decode shapes, flat output
    ("add", dict(rows=64, dim=576), lambda: add.build(64, 576)),
    ("add", dict(rows=1, dim=576), lambda: add.build(1, 576)),
    ("add", dict(rows=16, dim=64, flat_out=1), lambda: add.build(16, 64, flat_out=True)),
    ("swiglu", dict(rows=64, dim=1536), lambda: swiglu.build(64, 1536)),
    ("swiglu", dict(rows=1, dim=1536), lambda: swiglu.build(1, 1536)),
    # RoPE: split over rows (several rows per step) and over heads (decode)
    ("rope", dict(rows=64, heads=9, head_dim=64), lambda: rope.build(64, 9, 64)),
    ("rope", dict(rows=16, heads=4, head_dim=32), lambda: rope.build(16, 4, 32)),
    ("rope", dict(rows=1, heads=32, head_dim=64), lambda: rope.build(1, 32, 64)),
    ("rope", dict(rows=3, heads=16, head_dim=32), lambda: rope.build(3, 16, 32)),
]


@pytest.mark.parametrize("kind,params,build", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_interpreter_matches_reference(kind, params, build):
    text = build()
    data = _inputs(kind, params, seed=len(text) % 97)
    got, stats = _interp(text, data)
    _assert_close(got, _reference(kind, params, data), f"{kind} {params}")
    assert stats.calls > 0 and stats.tiles >= 1


def test_gemv_streams_x_then_weights_per_tile():
    """Every tile receives, on its own channel index, x once and then its weight blocks (row blocks x K chunks);
    the segment and the memory tiles take no part; each tile stores its rows once."""
    p = gemv_plan.plan_gemv(32, 16384)
    assert p.k_steps > 1 and p.row_steps > 1 and p.pingpong and (p.herd_x, p.herd_y) == (8, 2)
    text = gemv.build(32, 16384)
    _, stats = _interp(text, _inputs("gemv", dict(m=32, k=16384), 1))
    assert stats.channel_puts == 2 * p.tiles
    assert stats.channel_gets == p.tiles * (1 + p.row_steps * p.k_steps)
    assert stats.dmas == p.tiles                     # the y stores, one per tile
    assert stats.calls == p.tiles * p.row_steps * p.k_steps
    assert "memref<16384xbf16, 1 : i32>" not in text and ", 1 : i32>" not in text   # no L2 buffer


# ------------------------------------------------------------------------------- mutations

def _mutate(text: str, pattern: str, repl) -> str:
    out, n = re.subn(pattern, repl, text, count=1)
    assert n == 1, f"mutation pattern {pattern!r} did not match the builder output"
    return out


def _offsets(dst: str, src: str | None = None) -> str:
    """Regex of a DMA into L1 buffer `dst` (or from L1 `src` to L3), capturing the L3 offset list."""
    if src is None:
        return rf"(air\.dma_memcpy_nd \(%{dst}\[\] \[\] \[\], %\w+\[)([^\]]*)(\])"
    return rf"(air\.dma_memcpy_nd \(%\w+\[)([^\]]*)(\] \[[^\]]*\] \[[^\]]*\], %{src}\[\] \[\] \[\]\))"


def _first_offset_to(value: str):
    return lambda m: m.group(1) + ", ".join([value] + m.group(2).split(", ")[1:]) + m.group(3)


def _last_offset_to(value: str):
    return lambda m: m.group(1) + ", ".join(m.group(2).split(", ")[:-1] + [value]) + m.group(3)


def _const(text: str, value: int) -> str:
    """The name of an index constant in the (first) herd body."""
    herd = text[text.index("air.herd"):]
    return re.search(rf"(%\w+) = arith\.constant {value} : index", herd).group(1)


def _put(index: str, what: str) -> str:
    """Regex of the launch-level put of x (`%la_1`) or w (`%la`) on @gemv_in[index], capturing its parts."""
    src = {"x": "%la_1", "w": "%la"}[what]
    return rf"(air\.channel\.put @gemv_in\[{index}\] \({src}\[)([^\]]*)(\][^\n]*\n)"


def _swap_x_and_w(t: str) -> str:
    """Tile [c0, c1] gets its weight rows before x (the stream order broken for one tile)."""
    idx = "%c0, %c1_1"
    x = re.search(_put(idx, "x"), t)
    w = re.search(_put(idx, "w"), t)
    assert x and w and not t[x.end():w.start()].strip()
    return t[:x.start()] + w.group(0) + t[x.end():w.start()] + x.group(0) + t[w.end():]


def _chunk_offset_zero(t: str) -> str:
    """The kernel is told K chunk 0 at every step (it then reads x's first chunk and restarts its sums)."""
    t = _mutate(t, r"(func\.call @mv_bf16_\w+\([^)]*), %k0_i32\)", lambda m: m.group(1) + ", %c0_i32)")
    return t if "%c0_i32 = arith.constant 0 : i32" in t else t.replace(
        "%k0_i32 = ", "%c0_i32 = arith.constant 0 : i32\n          %k0_i32 = ", 1)


MUTATIONS = [
    # GEMV: x read past its start for one tile / the second tile streams the first tile's weight rows / one tile's
    # weights sent on its neighbour's channel / w before x on one stream / every K chunk told it is the first /
    # every tile stores at row 0
    ("gemv", dict(m=32, k=16384), lambda: gemv.build(32, 16384),
     lambda t: _mutate(t, _put("%c0, %c0", "x"), _last_offset_to("%c2"))),
    ("gemv", dict(m=512, k=640), lambda: gemv.build(512, 640),
     lambda t: _mutate(t, _put("%c0, %c1_1", "w"), _first_offset_to("%c0"))),
    ("gemv", dict(m=64, k=96), lambda: gemv.build(64, 96),
     lambda t: _mutate(t, r"(air\.channel\.put @gemv_in\[%c1_1, )%c0(\] \(%la\[)", lambda m: m.group(1) + "%c1_1"
                       + m.group(2))),
    ("gemv", dict(m=512, k=640), lambda: gemv.build(512, 640), _swap_x_and_w),
    ("gemv", dict(m=32, k=16384), lambda: gemv.build(32, 16384), _chunk_offset_zero),
    ("gemv", dict(m=64, k=96), lambda: gemv.build(64, 96),
     lambda t: _mutate(t, _offsets("", "y_l1"), _last_offset_to(_const(t, 0)))),
    # RMSNorm: x of the tile's first chunk for every step
    ("rmsnorm", dict(rows=64, dim=576, eps=1e-5), lambda: rmsnorm.build(64, 576, 1e-5),
     lambda t: _mutate(t, _offsets("x_l1"), _first_offset_to("%t"))),
    # add: b read one chunk late within the tile / y stored at the chunk of the previous tile
    ("add", dict(rows=64, dim=576), lambda: add.build(64, 576),
     lambda t: _mutate(t, _offsets("b_l1"), _first_offset_to("%t"))),
    # SwiGLU: up read at the tile's first chunk for every step
    ("swiglu", dict(rows=64, dim=1536), lambda: swiglu.build(64, 1536),
     lambda t: _mutate(t, _offsets("up_l1"), _first_offset_to("%t"))),
    # RoPE: every step of a tile reads the LUT rows of its first step / decode heads: every tile rotates head 0
    ("rope", dict(rows=64, heads=9, head_dim=64), lambda: rope.build(64, 9, 64),
     lambda t: _mutate(t, _offsets("lut_l1"), _first_offset_to("%t"))),
    ("rope", dict(rows=1, heads=32, head_dim=64), lambda: rope.build(1, 32, 64),
     lambda t: _mutate(t, _offsets("x_l1"), _last_offset_to(_const(t, 0)))),
]


@pytest.mark.parametrize("kind,params,build,mutate", MUTATIONS, ids=[f"{m[0]}-{i}" for i, m in enumerate(MUTATIONS)])
def test_wrong_offset_is_caught(kind, params, build, mutate):
    text = build()
    bad = mutate(text)
    assert bad != text
    data = _inputs(kind, params, seed=5)
    want = _reference(kind, params, data)
    good, _ = _interp(text, data)
    _assert_close(good, want, f"{kind} unmutated")
    try:
        got, _ = _interp(bad, data)
    except air_interp.InterpError:
        return  # caught as an out-of-bounds access or a call-shape error
    # a NaN output (an L1 buffer the mutated program never wrote) counts as noticed
    assert not np.abs(got - want).max() <= 0.5, f"{kind}: the interpreter did not notice the wrong offset"


# ------------------------------------------------------------------------------- data-movement rules

MODELS = {"smollm2": SMOLLM2_135M, "llama32-1b": LLAMA32_1B, "llama32-3b": LLAMA32_3B}


def _model_kernels(s):
    lm_rows = LlamaModel(s).lm_rows
    out = {}
    for rows in (1, 64, 2048):
        out[f"rmsnorm-{rows}"] = rmsnorm.build(rows, s.hidden, s.rms_eps)
        out[f"qknorm-{rows}"] = rmsnorm.build(rows, s.q_dim, s.rms_eps, s.head_dim)
        out[f"add-{rows}"] = add.build(rows, s.hidden)
        out[f"swiglu-{rows}"] = swiglu.build(rows, s.ffn)
        out[f"rope-q-{rows}"] = rope.build(rows, s.n_heads, s.head_dim)
        out[f"rope-k-{rows}"] = rope.build(rows, s.n_kv_heads, s.head_dim)
    for m, k in ((s.q_dim, s.hidden), (s.kv_dim, s.hidden), (s.hidden, s.q_dim), (s.ffn, s.hidden),
                 (s.hidden, s.ffn), (lm_rows, s.hidden)):
        out[f"gemv-{m}x{k}"] = gemv.build(m, k)
    return out


def _herd_body(text: str) -> tuple[str, int]:
    m = re.search(r"air\.herd @\w+ tile \(%\w+, %\w+\) in \(%\w+=(%\w+), %\w+=(%\w+)\)", text)
    consts = dict(re.findall(r"(%\w+) = arith\.constant (\d+) : index", text))
    tiles = int(consts[m.group(1)]) * int(consts[m.group(2)])
    return text[m.start():], tiles


@pytest.mark.parametrize("model", list(MODELS))
def test_builders_keep_the_data_movement_rules(model):
    for name, text in _model_kernels(MODELS[model]).items():
        assert not re.search(r"arith\.(divui|remui|divsi|remsi|floordivsi|ceildivui)", text), \
            f"{name}: DMA offsets must be affine (no div/rem)"
        body, tiles = _herd_body(text)
        lines = body.splitlines()
        depth, alloc_depth, loads, pinned, gets = 0, {}, [], set(), set()
        has_loop = "scf.for" in body
        for line in lines:
            s = line.strip()
            a = re.match(r"(%\w+) = memref\.alloc\(\) : (memref<[^>]*>)", s)
            if a:
                alloc_depth[a.group(1)] = depth
            p = re.match(r"memref\.store %\w+, (%\w+)\[", s)
            if p and depth == 1:
                pinned.add(p.group(1))
            d = re.match(r"air\.dma_memcpy_nd \((%\w+)\[\] \[\] \[\], %ha", s)
            if d:
                loads.append((d.group(1), depth))
            g = re.match(r"air\.channel\.get @\w+\[[^\]]*\] \((%\w+)\[\] \[\] \[\]\)", s)
            if g:  # an explicit per-tile channel (GEMV x then w): no broadcast DMA for air-dma-to-channel to hoist
                gets.add(g.group(1))
            c = re.match(r"func\.call @\w+\(([^)]*)\)", s)
            if c:
                for operand in c.group(1).split(", "):
                    if operand in alloc_depth and operand not in gets and not any(operand == ld for ld, _ in loads):
                        # written by the call: allocated once, outside the loops (ping-pong eligibility), and
                        # kept there (air-fuse-alloc-dealloc moves an alloc used only inside a loop into it)
                        assert alloc_depth[operand] == 1, f"{name}: {operand} (call output) allocated in a loop"
                        out_of_loop_use = operand in pinned or re.search(
                            rf"^\s{{10}}air\.dma_memcpy_nd \(%\w+\[[^\]]*\] \[[^\]]*\] \[[^\]]*\], {operand}\[",
                            body, re.M)
                        assert not has_loop or out_of_loop_use, f"{name}: {operand} has no use outside the loop"
            depth += s.count("{") - s.count("}")
        for buf, d in loads:
            # an L3 load is at the depth of its buffer's allocation: never loaded once outside a loop that uses it
            assert d == alloc_depth[buf], f"{name}: {buf} loaded outside the loop it is allocated in"
        for size in re.findall(r"memref<(\d+)xbf16, 2 : i32>", body):
            assert int(size) * 2 % 4 == 0, f"{name}: L1 buffer of {size} bf16 is not whole 32-bit words"
        # loops that hold DMA-filled buffers run an even number of times (ping-pong safe) or are not emitted
        consts = dict(re.findall(r"(%\w+) = arith\.constant (\d+) : index", body))
        for lo, hi, st in re.findall(r"scf\.for %\w+ = (%\w+) to (%\w+) step (%\w+)", body):
            trips = (int(consts[hi]) - int(consts[lo])) // int(consts[st])
            assert trips >= 2 and trips % 2 == 0, f"{name}: a loop of {trips} trip(s) is emitted"


@pytest.mark.parametrize("model", list(MODELS))
def test_gemv_streams_fill_the_shim(model):
    """At every GEMV shape of the model: one channel index per tile, on it x (whole) then the tile's weight rows
    (one contiguous run) - two puts at launch level -, the herd gets x once and the weight blocks in its loops;
    16 tiles where m allows, so 16 shim MM2S streams, 16 y stores; no memory tile."""
    from kernel_builder.hw import analyze_module
    for name, text in _model_kernels(MODELS[model]).items():
        if not name.startswith("gemv"):
            continue
        m, k = map(int, name[5:].split("x"))
        p = gemv_plan.plan_gemv(m, k)
        assert p.tiles == 16 and (p.herd_x, p.herd_y) == (8, 2), name
        puts = re.findall(r"air\.channel\.put @gemv_in\[(%\w+), (%\w+)\] \((%la_1|%la)\[([^\]]*)\] \[([^\]]*)\]", text)
        assert len(puts) == 2 * p.tiles
        for i in range(0, len(puts), 2):
            (xa, xb, xsrc, _, _), (wa, wb, wsrc, woff, _) = puts[i], puts[i + 1]
            assert (xa, xb) == (wa, wb) and (xsrc, wsrc) == ("%la_1", "%la"), name   # x, then w, on one index
        assert len({(a, b) for a, b, *_ in puts}) == p.tiles
        rep = analyze_module(text)
        assert rep.ok, rep.first_violation()
        u = rep.usage
        assert (u.shim_mm2s, u.shim_s2mm, u.memtile_mm2s, u.l2_bytes) == (16, 16, 0, 0), name
        # per shim column 2 x (x + weights) + 2 y stores, each its own BD (the tool's runtime sequence: bd_id 0-5)
        assert u.core_s2mm <= 2 and u.core_mm2s == 1 and u.shim_bds == 6
        assert u.l1_bytes == p.l1_bytes() + u.stack_bytes, name
        assert p.core_task_repeats <= gemv_plan.CORE_TASK_MAX_REPEATS and p.contiguous_stream


def test_plans_at_llama_1b_shapes():
    s = LLAMA32_1B
    p = gemv_plan.plan_gemv(s.hidden, s.ffn)   # down projection, K = 8192: one whole row per step
    assert p.rows_per_tile * 2 % 4 == 0 and (p.tile_m, p.k_chunk) == (1, s.ffn) and p.pingpong
    assert p.l1_bytes() == sum(p.l1_buffers().values()) <= planner.L1_BUDGET
    b = p.l1_buffers()
    assert b["w"] == 2 * 2 * p.tile_m * p.k_chunk                                   # ping-pong copies
    assert b["x"] == 2 * s.ffn and b["y"] == 2 * p.rows_per_tile and b["acc_f32"] == 4 * p.tile_m  # one copy each
    lm = gemv_plan.plan_gemv(LlamaModel(s).lm_rows, s.hidden)   # 16384 x 2048: whole rows, one contiguous stream
    assert (lm.tiles, lm.k_steps, lm.rows_per_tile) == (16, 1, 1024) and lm.l1_bytes() <= planner.L1_BUDGET
    r = rmsnorm_plan.plan_rmsnorm(2048, s.hidden)
    assert r.herd == 8 and r.steps % 2 == 0 and r.l1_buffers()["w"] == 2 * 2 * s.hidden
    assert rmsnorm_plan.plan_rmsnorm(1, s.hidden).l1_buffers() == {"x": 4096, "w": 4096, "y": 4096}  # no loop
    e = swiglu_plan.plan_swiglu(2048, s.ffn)
    assert e.herd == 8 and e.chunk_elements == 4096 and e.l1_bytes() == 5 * 2 * 4096
