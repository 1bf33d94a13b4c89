"""The `attention` kernel (kernel_builder/attention/builder.py) executed by the AIR interpreter (emu-interp:
herds, L1/L2 buffers, DMAs, broadcast channels, the tile primitives' numpy model) against
kernel_builder.reference.attention, for prefill chunks (at position 0 and over a KV prefix) and decode
(flash-decoding over the window, merged), at reduced shapes and at SmolLM2 decode shapes. Keys past the last
query hold NaN/inf: they must be masked whatever they hold. A wrong K/V tile offset, broadcast slice, Q-capture
row or merge index in the builder's text must change the result (or stop the interpreter).
"""
from __future__ import annotations

import re

import numpy as np
import pytest

from multi_launch_builder.emulator import air_interp
from kernel_builder.attention import plan as planner
from kernel_builder.attention import builder as attention
from kernel_builder.numerics import BF16
from kernel_builder.reference import attention as reference

ULPS = 2


def _data(rows, kv_rows, heads, kv_heads, hd, pos, seed=0, garbage=True):
    rng = np.random.default_rng(seed)
    q = (rng.standard_normal((rows, heads * hd)) * 1.5).astype(np.float32).astype(BF16)
    k = (rng.standard_normal((kv_rows, kv_heads * hd)) * 1.5).astype(np.float32).astype(BF16)
    v = rng.standard_normal((kv_rows, kv_heads * hd)).astype(np.float32).astype(BF16)
    if garbage:
        k[pos + rows:], v[pos + rows:] = np.inf, np.nan   # past the last query: never part of the result
    return q, k, v, np.array([pos], np.int32)


def _interp(text, q, k, v, pos):
    o = np.zeros_like(q)
    args = [q.copy(), k.copy(), v.copy(), pos.copy(), o]
    stats = air_interp.compile_module(text).run(args)
    for a, b in zip(args[:4], (q, k, v, pos)):   # inputs are never written
        np.testing.assert_array_equal(a.view(np.uint8), b.view(np.uint8))
    return o, stats


def _close(got, want) -> tuple[bool, float]:
    g, w = got.astype(np.float32), want.astype(np.float32)
    scale = float(np.abs(w).max())
    tol = ULPS * 2.0 ** (np.floor(np.log2(scale)) - 7) if scale else 0.0
    err = float(np.abs(g - w).max()) if np.isfinite(g).all() else float("inf")
    return err <= tol, err


def _check(shape, pos, text=None, seed=0):
    rows, kv_rows, heads, kv_heads, hd = shape
    text = text or attention.build(*shape)
    q, k, v, p = _data(*shape, pos, seed=seed)
    got, stats = _interp(text, q, k, v, p)
    want = reference(q, k, v, p, rows=rows, kv_rows=kv_rows, heads=heads, kv_heads=kv_heads, head_dim=hd)
    ok, err = _close(got, want)
    assert ok, f"{shape} at pos {pos}: differs by {err} from the reference"
    return stats


# ------------------------------------------------------------------------------------------------ prefill
PREFILL = [
    ((16, 16, 2, 1, 32), 0),        # the embedded-test model's bucket: one core group of 2 heads
    ((64, 64, 4, 2, 32), 0),        # first chunk: 2 kv heads side by side (xh = 2)
    ((64, 64, 6, 2, 32), 0),        # GQA group 3
    ((64, 64, 9, 3, 64), 0),        # SmolLM2-135M's 64-row bucket (group 3: a pad Q item)
    ((32, 128, 6, 2, 32), 70),      # group 3 chunk over a KV prefix (the pad item, Q halves overlapping)
    ((32, 128, 4, 2, 32), 0),       # a chunk at position 0 of a longer window
    ((32, 128, 4, 2, 32), 50),      # chunk over a KV prefix, causal edge inside a K/V tile
    ((32, 128, 4, 2, 32), 96),      # the last chunk of the window
    ((64, 192, 16, 2, 32), 64),     # GQA group 8: two head passes of 4 cores
    ((128, 128, 4, 1, 64), 0),      # several query blocks side by side (xq = 2), head_dim 64
]


@pytest.mark.parametrize("shape,pos", PREFILL, ids=[f"r{s[0]}_w{s[1]}_h{s[2]}_{s[3]}_d{s[4]}_p{p}" for s, p in PREFILL])
def test_prefill_matches_reference(shape, pos):
    stats = _check(shape, pos)
    p = planner.plan_attention(*shape)
    iterations = p.iterations                                # launch grid: kv head x round x head pass
    assert iterations == p.kv_heads * p.head_passes * p.rounds
    assert stats.tiles == iterations * p.herd_x * p.herd_y
    # per launch iteration every core receives the position and the Q items plus the whole window (static
    # DMAs); the segment assembles each item from the two feeds and gathers each core's output tile in L2
    items = p.q_items + p.kv_tiles
    cores = p.herd_x * p.herd_y
    assert stats.channel_gets == iterations * (cores * (1 + items) + 2 * items + cores)
    assert stats.peak_l1_bytes <= sum(p.l1_buffers().values())


def test_prefill_chunks_compose_to_the_whole_prompt():
    """Two chunks of 32 rows over one window (the second at position 32) give the single-pass rows."""
    heads, kv_heads, hd, n = 4, 2, 32, 64
    q, k, v, _ = _data(n, n, heads, kv_heads, hd, 0, garbage=False)
    whole, _ = _interp(attention.build(n, n, heads, kv_heads, hd), q, k, v, np.array([0], np.int32))
    text = attention.build(32, n, heads, kv_heads, hd)
    for pos in (0, 32):
        part, _ = _interp(text, np.ascontiguousarray(q[pos:pos + 32]), k, v, np.array([pos], np.int32))
        assert _close(part, whole[pos:pos + 32])[0]


# ------------------------------------------------------------------------------------------------ decode
SMALL_DECODE = (1, 256, 4, 2, 32)
SMOLLM2_DECODE = (1, 256, 9, 3, 64)


@pytest.mark.parametrize("pos", [0, 1, 63, 64, 65, 100, 200, 255])
def test_decode_matches_reference(pos):
    stats = _check(SMALL_DECODE, pos)
    p = planner.plan_attention(*SMALL_DECODE)
    assert stats.tiles == p.iterations * p.cores
    assert stats.calls_by_symbol[f"attnd_merge_bf16_hd32_q2_k{p.lk}_n{p.herd_x}"] == p.iterations * p.herd_y


@pytest.mark.parametrize("pos", [1, 63, 64, 65, 255])
def test_decode_at_smollm2_shapes(pos):
    _check(SMOLLM2_DECODE, pos, seed=pos)


def test_decode_at_position_1000_of_a_1024_window():
    _check((1, 1024, 9, 3, 64), 1000, seed=5)


def test_decode_at_the_context_limit_of_smollm2():
    """The last position of SmolLM2-135M's 8192-token context, over the whole window."""
    _check((1, 8192, 9, 3, 64), 8191, seed=3)


# ------------------------------------------------------------------------------------------------ mutations
def _mutated_fails(shape, pos, text, mutated):
    """The good text matches the reference; the mutated one does not (or the interpreter stops)."""
    _check(shape, pos, text=text)
    try:
        _check(shape, pos, text=mutated)
    except AssertionError:
        return
    except air_interp.InterpError:
        return
    pytest.fail("the interpreter did not notice the mutation")


def _sub(text, pattern, repl) -> str:
    out, n = re.subn(pattern, repl, text, count=1)
    assert n == 1, f"pattern {pattern!r} not found"
    return out


def test_prefill_wrong_kv_tile_offset_is_caught():
    shape = (32, 128, 4, 2, 32)
    text = attention.build(*shape)
    # group 0's K feed reads kv head 0's keys in every launch iteration (its kv-head offset dropped)
    mutated = _sub(text, r"(air\.channel\.put @attn_fk\[%c0, %c0\] \(%la_1\[%c0, )(%lx)", lambda m: m.group(1) + "%c0")
    _mutated_fails(shape, 50, text, mutated)


def test_prefill_wrong_item_half_is_caught():
    shape = (32, 128, 4, 2, 32)
    text = attention.build(*shape)
    # group 0's V half lands on its K half: every item carries V where K belongs
    mutated = _sub(text, r"(air\.channel\.get @attn_fv\[%c0\w*, %c0\w*\] \(%item_l2\[)(%\w+)",
                   lambda m: m.group(1) + "%c0_1")
    _mutated_fails(shape, 50, text, mutated)


def test_prefill_wrong_q_slice_is_caught():
    shape = (64, 64, 4, 2, 32)
    p = planner.plan_attention(*shape)
    assert p.lq == p.lk == 16 and p.herd_x == 4 and p.q_items_per_head == 2
    text = attention.build(*shape)
    # the second feed carries the first lk rows of each Q chunk again (its row offset lk dropped): half of the
    # interleaved 8-row blocks attend with the wrong queries
    mutated = _sub(text, r"(air\.channel\.put @attn_fv\[%c0, %c0\] \(%la\[%\w+, %\w+, )%c16\b",
                   lambda m: m.group(1) + "%c0")
    _mutated_fails(shape, 0, text, mutated)


def test_prefill_wrong_q_capture_slot_is_caught():
    shape = (64, 64, 4, 2, 32)
    text = attention.build(*shape)
    # a core keeps the Q blocks of its head's first core (slot without its tx: the interleave lost)
    mutated = _sub(text, r"(%t_\d+) = arith\.addi (%t_\d+), %tx : index", lambda m: f"{m.group(1)} = arith.addi "
                   f"{m.group(2)}, %c0_1 : index")
    _mutated_fails(shape, 0, text, mutated)


def test_prefill_unblocked_items_are_caught():
    shape = (64, 64, 4, 2, 32)
    text = attention.build(*shape)
    # the memory tile writes the K/Q rows of the first feed unblocked: the kernel reads rows as 8x8 blocks
    mutated = _sub(text, r"(air\.channel\.get @attn_fk\[%c0_1, %c0_1\] \(%item_l2)\[[^]]*\] \[[^]]*\] \[[^]]*\]",
                   lambda m: m.group(1) + "[] [] []")
    _mutated_fails(shape, 0, text, mutated)


def test_prefill_wrong_drain_index_is_caught():
    shape = (64, 64, 4, 2, 32)
    text = attention.build(*shape)
    # query block 1's gather takes core (0, 1)'s output tile (a wrong channel index of the L2 drain)
    mutated = _sub(text, r"air\.channel\.get @attn_o\[%c1\w*, (%c1\w*)\]",
                   lambda m: f"air.channel.get @attn_o[%c0_1, {m.group(1)}]")
    _mutated_fails(shape, 0, text, mutated)


def test_prefill_wrong_drain_column_is_caught():
    shape = (64, 64, 4, 2, 32)
    text = attention.build(*shape)
    # head 1's output tile lands on head 0's columns of the L2 buffer
    mutated = _sub(text, r"(air\.channel\.get @attn_o\[%c0\w*, %c1\w*\] \(%out_l2\[%c0\w*, )(%c1\w*)",
                   lambda m: m.group(1) + "%c0_1")
    _mutated_fails(shape, 0, text, mutated)


def test_prefill_wrong_drain_row_is_caught():
    shape = (64, 64, 4, 2, 32)
    text = attention.build(*shape)
    # query block 1's L2 buffer is written over block 0's rows of o (its interleaved row offset 8 dropped)
    rows = re.findall(r"air\.dma_memcpy_nd \(%sa_4\[%\w+, (%\w+), ", text)
    assert len(rows) == planner.plan_attention(*shape).herd_x
    mutated = _sub(text, rf"(air\.dma_memcpy_nd \(%sa_4\[%\w+, ){re.escape(rows[1])}\b", lambda m: m.group(1) + rows[0])
    _mutated_fails(shape, 0, text, mutated)


def test_decode_wrong_kv_tile_offset_is_caught():
    text = attention.build(*SMALL_DECODE)
    # split 1 streams split 0's keys (its split offset dropped)
    mutated = _sub(text, r"(%sa_1\[)%c1\w*(, %key)", lambda m: m.group(1) + "%c0" + m.group(2))
    _mutated_fails(SMALL_DECODE, 200, text, mutated)


def test_decode_wrong_kv_head_slice_is_caught():
    text = attention.build(*SMALL_DECODE)
    assert planner.plan_attention(*SMALL_DECODE).herd_y == 2
    # core (0, 1) gets kv head 0's columns of its split's item
    mutated = _sub(text, r"(air\.channel\.put @attn_in\[%c0, %c1\w*\] \(%kv_l2\[%c0, )%c32\b",
                   lambda m: m.group(1) + "%c0")
    _mutated_fails(SMALL_DECODE, 200, text, mutated)


WIDE_DECODE = (1, 256, 16, 8, 32)   # two launch iterations of 4 kv heads side by side


def test_decode_wrong_query_slice_is_caught():
    p = planner.plan_attention(*WIDE_DECODE)
    assert p.herd_y == 4 and p.launch_grid == (2,)
    text = attention.build(*WIDE_DECODE)
    # every launch iteration's items carry the query rows of the first iteration's kv heads
    mutated = _sub(text, r"(air\.dma_memcpy_nd \(%kv_l2\[%c\d+, %c0, %c0\] .*?, %sa\[%c0, %c0, )(%t)\b",
                   lambda m: m.group(1) + "%c0")
    _mutated_fails(WIDE_DECODE, 200, text, mutated)


def test_decode_wrong_merge_slot_is_caught():
    text = attention.build(*SMALL_DECODE)
    # split 1's partial lands in split 0's slot of the L2 buffer
    mutated = _sub(text, r"(air\.channel\.get @attn_part\[%c1\w*, %c0\] \(%parts_l2\[)(%\w+)",
                   lambda m: m.group(1) + "%c0")
    _mutated_fails(SMALL_DECODE, 200, text, mutated)


# ------------------------------------------------------------------------------------------------ structure
@pytest.mark.parametrize("shape", [(64, 64, 4, 2, 32), SMALL_DECODE, (2048, 2048, 32, 8, 64), (1, 2048, 32, 8, 64)])
def test_each_core_has_two_inbound_and_one_outbound_stream(shape):
    """Per herd body: the position and the item stream in, one tile out (the NPU2 core's 2 + 2 DMA channels);
    every loop bound in the module is a constant (no position-dependent DMA)."""
    text = attention.build(*shape)
    for herd in re.finditer(r"air\.herd @(\w+) tile", text):
        start = text.index("{", herd.end())
        body = text[start:_close_brace(text, start)]
        inbound = len(re.findall(r"air\.channel\.get", body)) + \
            len(re.findall(r"air\.dma_memcpy_nd \(%\w+_l1\[", body))
        outbound = len(re.findall(r"air\.channel\.put", body)) + \
            len(re.findall(r"air\.dma_memcpy_nd \(%ha\w*\[", body))
        assert inbound <= 2 and outbound <= 1, (herd.group(1), inbound, outbound)
    for loop in re.finditer(r"scf\.for %\w+ = (%\w+) to (%\w+) step", text):
        for bound in loop.groups():
            assert re.search(rf"{re.escape(bound)} = arith\.constant", text), f"loop bound {bound} is not constant"


def _close_brace(text: str, start: int) -> int:
    depth = 0
    for i in range(start, len(text)):
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        if depth == 0:
            return i
    raise AssertionError("unbalanced braces")


@pytest.mark.parametrize("bad,words", [
    ((64, 64, 30, 8, 64), ["heads=30", "kv_heads=8"]),
    ((64, 64, 32, 8, 48), ["head_dim=48", "multiple of 32"]),
    ((128, 64, 32, 8, 64), ["rows=128", "kv_rows=64"]),
    ((64, 100, 32, 8, 64), ["kv_rows=100", "multiple of 16"]),
    ((60, 64, 32, 8, 64), ["rows=60"]),
])
def test_bad_shapes_are_one_clear_error(bad, words):
    with pytest.raises(ValueError) as e:
        attention.build(*bad)
    assert str(e.value).startswith("attention: ")
    for w in words:
        assert w in str(e.value)


# ------------------------------------------------------------------------------------------------ hardware model
def test_hw_model_counts_one_shim_stream_per_channel_index():
    """Puts from L3 on one channel index share one shim allocation (AIRToAIESchedulingUtils.cpp reuses the
    allocation of a channel declaration): the prefill's Q and K (V) puts are one MM2S stream per feed, and the
    output leaves through the memory tile, one S2MM stream per query block (not one per core): all 32 cores
    at Llama-3.2-1B shapes. The kernel fits the chip with the preset the model layer records for it
    (kernel_builder.hw.tune.preset_for_kernels)."""
    from kernel_builder.hw import analyze_module
    from kernel_builder.hw.tune import preset_for_kernels
    shape = (2048, 2048, 32, 8, 64)
    p = planner.plan_attention(*shape)
    assert p.cores == 32
    text = attention.build(*shape)
    rep = analyze_module(text, "attention", preset=preset_for_kernels([text]))
    assert rep.ok, rep.first_violation()
    (launch,) = rep.launches
    mm2s = [f for f in launch.work.flows if f.direction == "MM2S"]
    assert len(mm2s) == p.channels()["shim_mm2s"] == 3
    assert len([f for f in mm2s if "+" in f.what]) == 2      # each feed stream carries Q, then K (or V)
    s2mm = [f for f in launch.work.flows if f.direction == "S2MM"]
    assert len(s2mm) == p.channels()["shim_s2mm"] == p.herd_x
    assert rep.usage.herd_tiles == 32


def _mmul_macs(text: str) -> int:
    from kernel_builder.hw import analyze_module
    from kernel_builder.hw.tune import preset_for_kernels
    rep = analyze_module(text, "attention", preset=preset_for_kernels([text]))
    assert rep.ok, rep.first_violation()
    w = rep.launches[0].work
    return w.tile_mmul_macs + w.tile_mmul_emulated_macs   # block-float or emulated: the kernel's defines decide


@pytest.mark.parametrize("shape", [(2048, 2048, 32, 8, 64), (256, 1024, 32, 8, 64), (64, 64, 9, 3, 64)])
def test_hw_model_charges_the_tiles_the_cores_compute(shape):
    """The prefill cores skip K/V tiles (and 8-row blocks) past the causal bound; the model evaluates each
    item call's operands (tile index, query position at the top of the position's llama_npu.range) and
    charges the busiest core per item: the plan's busiest_blocks. Without the range (the position unknown)
    every item is a full tile, the Q items included - what the model charged before."""
    p = planner.plan_attention(*shape)
    text = attention.build(*shape)
    per_block = 2 * 8 * p.lk * p.head_dim
    assert _mmul_macs(text) == p.busiest_blocks() * per_block
    unknown = _sub(text, r" \{llama_npu\.range = \[\d+, \d+\]\}", "")
    full = p.iterations * p.steps * (p.lq // 8) * per_block
    assert _mmul_macs(unknown) == full
    # causal: at most about half the full work (plus the diagonal tiles) at the top position of the window
    assert p.busiest_blocks() * per_block < (0.75 if shape[0] == shape[1] and shape[0] >= 256 else 1.0) * full


def test_position_outside_its_declared_range_is_refused():
    """The interpreter checks the llama_npu.range the hardware model costs at: a chunk whose rows would end past
    the window is an error, not a silent under-count."""
    shape = (32, 128, 4, 2, 32)
    text = attention.build(*shape)
    q, k, v, _ = _data(*shape, 0)
    with pytest.raises(air_interp.InterpError, match="llama_npu.range"):
        _interp(text, q, k, v, np.array([97], np.int32))


@pytest.mark.parametrize("shape", [(64, 64, 9, 3, 64), (2048, 2048, 9, 3, 64), (2048, 8192, 24, 8, 128),
                                   (2048, 2048, 24, 8, 128), (1, 256, 9, 3, 64), (1, 8192, 24, 8, 128),
                                   (1, 32768, 32, 8, 64)])
def test_item_loops_have_an_even_or_single_trip_count(shape):
    """aircc's ping-pong transform makes three copies of a buffer in a loop of an odd trip count (and mlir-air
    after PR #2000 refuses such loops): a GQA group of 3 heads gets a pad Q item, and the model counts two
    copies of the item buffers, within L1."""
    from kernel_builder.hw import analyze_module
    from kernel_builder.hw.tune import preset_for_kernels
    p = planner.plan_attention(*shape)
    assert p.steps == 1 or p.steps % 2 == 0, p
    text = attention.build(*shape)
    rep = analyze_module(text, "attention", preset=preset_for_kernels([text]))
    assert rep.ok, rep.first_violation()
    assert rep.usage.l1_bytes <= 65536
