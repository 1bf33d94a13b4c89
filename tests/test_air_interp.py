"""The `emu-interp` device (multi_launch_builder/emulator/air_interp/) executes the AIR text itself.

1. Agreement: every stitched module of a tiny Llama-like model and every single-kernel module, run by the
   interpreter, matches the reference numerics (EmuDevice / kernel_builder.reference) within 2 bf16 ulps of
   each buffer's scale (the interpreter accumulates GEMM per K tile, the reference in one f32 BLAS call per 64-row block).
2. The point of the mode: mutating a herd body (a DMA offset, a herd size) changes the interpreter's result,
   while the reference-executing emu, which never reads herd bodies, does not notice.
"""
from __future__ import annotations

import math
import re

import numpy as np
import pytest

from multi_launch_builder.emulator import air_interp
from multi_launch_builder.devices.base import Artifact, DeviceRunError
from multi_launch_builder.devices.emu import EmuDevice
from multi_launch_builder.devices.interp import InterpEmuDevice
from kernel_builder.numerics import BF16
from kernel_builder.reference import KERNELS
from llama_npu.models.llama import LlamaModel, ModelShapes

TINY = ModelShapes(hidden=64, n_heads=2, n_kv_heads=1, head_dim=32, ffn=128, vocab=256, n_layers=1,
                   rms_eps=1e-5)
SEQ = 16
ULPS = 2


@pytest.fixture(scope="module")
def stitched():
    from multi_launch_builder.stitcher import stitch
    m = LlamaModel(TINY)
    decls = m.modules([SEQ]) + m.modules([SEQ], decode_attention="host")
    return {d.name: stitch(d) for d in decls}


def _artifact(tmp_path, name: str, text: str) -> Artifact:
    path = tmp_path / f"{name}.mlir"
    path.write_text(text)
    return Artifact(name=name, mlir=path)


class I32Shape(tuple):
    """The shape of an i32 argument (a per-call scalar such as the position)."""


def _inputs(shapes, seed: int) -> list[np.ndarray]:
    """Random bf16 data per argument; i32 scalars (positions) are 0, valid for every module."""
    rng = np.random.default_rng(seed)
    return [np.zeros(s, np.int32) if isinstance(s, I32Shape) else
            (rng.standard_normal(math.prod(s)) * 0.5).astype(np.float32).astype(BF16).reshape(s) for s in shapes]


def _run(device, artifact: Artifact, data: list[np.ndarray]) -> list[np.ndarray]:
    handle = device.load(artifact)
    bufs = []
    for a in data:
        b = device.alloc(a.nbytes)
        device.write(b, a)
        bufs.append(b)
    device.run(handle, bufs)
    return [device.read(b, a.shape, a.dtype).astype(np.float32) for b, a in zip(bufs, data)]


def _tolerance(ref: np.ndarray) -> float:
    scale = float(np.abs(ref).max())
    return 0.0 if scale == 0 else ULPS * 2.0 ** (math.floor(math.log2(scale)) - 7)


def _assert_close(got: list[np.ndarray], ref: list[np.ndarray], what: str) -> None:
    for i, (g, r) in enumerate(zip(got, ref)):
        err = float(np.abs(g - r).max())
        assert np.isfinite(g).all(), f"{what}: argument {i} has non-finite values"
        assert err <= _tolerance(r), f"{what}: argument {i} differs by {err} (> {ULPS} bf16 ulps of its scale)"


def _shapes_of(text: str) -> list[tuple[int, ...]]:
    from multi_launch_builder.emulator.launch_program import read_launch_program
    prog = read_launch_program(text)
    return [I32Shape(s) if d == "i32" else tuple(s) for s, d in zip(prog.arg_shapes, prog.arg_dtypes)]


# ---------------------------------------------------------------------------------------- stitched modules

MODULES = ["qkv_s16", "attn_s16", "attn_s16_kv64", "ffn_s16", "qkv_dec", "ffn_dec", "layer_kv64", "lm_head"]


@pytest.mark.parametrize("name", MODULES)
def test_stitched_module_matches_reference_emu(stitched, tmp_path, name):
    text = stitched[name]
    art = _artifact(tmp_path, name, text)
    data = _inputs(_shapes_of(text), seed=MODULES.index(name))
    ref = _run(EmuDevice(), art, data)
    dev = InterpEmuDevice()
    got = _run(dev, art, data)
    _assert_close(got, ref, name)
    stats = dev.last_run_stats
    assert stats.dmas > 0 and stats.tiles > 0
    assert stats.peak_l1_bytes <= 64 * 1024, f"{name}: one tile holds {stats.peak_l1_bytes} bytes of L1"
    # at least one argument was really written (not just left as the random input)
    assert any(not np.array_equal(g, d.astype(np.float32)) for g, d in zip(got, data))


def test_counters_match_emu(stitched, tmp_path):
    art = _artifact(tmp_path, "qkv_dec", stitched["qkv_dec"])
    data = _inputs(_shapes_of(stitched["qkv_dec"]), seed=7)
    a, b = EmuDevice(), InterpEmuDevice()
    _run(a, art, data)
    _run(b, art, data)
    assert (a.stats.bytes_written, a.stats.bytes_read, a.stats.runs, a.stats.loads) == \
        (b.stats.bytes_written, b.stats.bytes_read, b.stats.runs, b.stats.loads)
    assert b.name == "emu-interp"


# ---------------------------------------------------------------------------------------- mutations

def _mutate(text: str, pattern: str, repl) -> str:
    out, n = re.subn(pattern, repl, text, count=1)
    assert n == 1, f"mutation pattern {pattern!r} did not match the builder output"
    return out


def _check_mutation_detected(tmp_path, name: str, text: str, mutated: str, seed: int) -> None:
    data = _inputs(_shapes_of(text), seed=seed)
    good, bad = _artifact(tmp_path, name, text), _artifact(tmp_path, name + "_mut", mutated)
    ref_good, ref_bad = _run(EmuDevice(), good, data), _run(EmuDevice(), bad, data)
    for x, y in zip(ref_good, ref_bad):  # the reference executor ignores herd bodies
        np.testing.assert_array_equal(x, y)
    int_good, int_bad = _run(InterpEmuDevice(), good, data), _run(InterpEmuDevice(), bad, data)
    assert any(not np.array_equal(x, y) for x, y in zip(int_good, int_bad)), \
        f"{name}: the interpreter did not notice the mutated herd body"


def test_rope_lut_dma_offset_mutation_is_detected(stitched, tmp_path):
    # every query row reads the LUT row of position 0 instead of its own
    text = stitched["qkv_s16"]
    mutated = _mutate(text, r"(air\.dma_memcpy_nd \(%q_roped_lut_l1\[\] \[\] \[\], %\w+\[)(%\w+)(, )(%\w+)\]",
                      lambda m: f"{m.group(1)}{m.group(4)}{m.group(3)}{m.group(4)}]")
    _check_mutation_detected(tmp_path, "qkv_s16", text, mutated, seed=11)


def test_gemv_herd_size_mutation_is_detected(stitched, tmp_path):
    # the q projection's herd shrinks to its second dimension: the tiles outside it never take the x and weight
    # rows the launch puts on their channels - on the device the launch would hang; the interpreter says so
    text = stitched["qkv_dec"]
    mutated = _mutate(text, r"(air\.herd @q_gemv_herd tile \([^)]*\) in \(%\w+=)(%\w+)(, %\w+=)(%\w+)\)",
                      lambda m: f"{m.group(1)}{m.group(4)}{m.group(3)}{m.group(4)})")
    art = _artifact(tmp_path, "shrunk", mutated)
    with pytest.raises(DeviceRunError, match=r"unconsumed channel data: .* on @q_gemv_in\[2, 0\]"):
        _run(InterpEmuDevice(), art, _inputs(_shapes_of(text), seed=12))


def test_out_of_bounds_dma_fails_naming_the_line(stitched, tmp_path):
    text = stitched["qkv_dec"]
    # the last q gemv tile's weight put walks each row with element stride 8: it runs past the buffer
    puts = list(re.finditer(r"(air\.channel\.put @q_gemv_in\[[^\]]*\] \(%q_la\[[^\]]*\] \[[^\]]*\] \[%\w+, )(%\w+)\]",
                            text))
    last = puts[-1]
    mutated = text[:last.start(2)] + "%q_c8" + text[last.end(2):]
    assert "%q_c8 = arith.constant 8 : index" in text
    art = _artifact(tmp_path, "oob", mutated)
    with pytest.raises(DeviceRunError, match=r"line \d+.*touches element \d+ of a 4096-element buffer"):
        _run(InterpEmuDevice(), art, _inputs(_shapes_of(text), seed=1))


def test_unknown_op_is_a_clear_error():
    text = """module {
  func.func @f(%arg0: memref<4xbf16>) {
    %c0 = arith.constant 0 : index
    %x = arith.frobnicate %c0 : index
    return
  }
}
"""
    with pytest.raises(air_interp.InterpError, match=r"line 4.*arith\.frobnicate"):
        air_interp.compile_module(text)


# ---------------------------------------------------------------------------------------- single kernels

def _kernel_cases():
    from kernel_builder.add import builder as add
    from kernel_builder.bias_add import builder as bias_add
    from kernel_builder.gemm import builder as gemm
    from kernel_builder.gemv import builder as gemv
    from kernel_builder.rmsnorm import builder as rmsnorm
    from kernel_builder.rope import builder as rope
    from kernel_builder.swiglu import builder as swiglu
    return [
        ("rmsnorm", lambda: rmsnorm.build(16, 64, 1e-5), {"rows": 16, "dim": 64, "eps": 1e-5}),
        ("add", lambda: add.build(16, 64), {"rows": 16, "dim": 64}),
        ("add_flat", lambda: add.build(16, 64, flat_out=True), {"rows": 16, "dim": 64, "flat_out": 1}),
        ("bias-add", lambda: bias_add.build(16, 96), {"rows": 16, "dim": 96}),
        ("bias-add_row", lambda: bias_add.build(1, 256), {"rows": 1, "dim": 256}),
        ("gemm", lambda: gemm.build(32, 128, 64), {"m": 32, "k": 128, "n": 64}),
        ("gemm-swiglu", lambda: gemm.build(32, 128, 64, "swiglu"), {"m": 32, "k": 128, "n": 64}),
        ("gemm-swiglu_wide", lambda: gemm.build(16, 192, 256, "swiglu"), {"m": 16, "k": 192, "n": 256}),
        ("gemm-bias", lambda: gemm.build(32, 128, 64, "bias"), {"m": 32, "k": 128, "n": 64}),
        ("gemm-bias_wide", lambda: gemm.build(16, 192, 256, "bias"), {"m": 16, "k": 192, "n": 256}),
        ("gemv", lambda: gemv.build(64, 96), {"m": 64, "k": 96}),
        ("rope", lambda: rope.build(8, 4, 32), {"rows": 8, "heads": 4, "head_dim": 32}),
        ("swiglu", lambda: swiglu.build(4, 128), {"rows": 4, "dim": 128}),
    ]


@pytest.mark.parametrize("case", _kernel_cases(), ids=lambda c: c[0])
def test_single_kernel_matches_reference(tmp_path, case):
    label, build, params = case
    text = build()
    kind = label.split("_")[0].replace("-", "_")
    shapes = _shapes_of(text)
    data = _inputs(shapes, seed=len(label))
    got = _run(InterpEmuDevice(), _artifact(tmp_path, label, text), data)
    ref = np.asarray(KERNELS[kind](*data[:-1], **params)).astype(np.float32).reshape(shapes[-1])
    _assert_close([got[-1]], [ref], label)
    for g, d in zip(got[:-1], data[:-1]):  # inputs are never written
        np.testing.assert_array_equal(g, d.astype(np.float32))


# ---------------------------------------------------------------------------------------- channels

def _gemm_program(m, k, n):
    from kernel_builder.gemm import plan as gemm_plan
    from kernel_builder.gemm import builder as gemm
    return gemm_plan.plan_gemm(m, k, n), gemm.build(m, k, n)


def _gemm_inputs(m, k, n, seed=3):
    rng = np.random.default_rng(seed)
    a = (rng.standard_normal((m, k)) * 0.5).astype(BF16)
    w = (rng.standard_normal((n, k)) * 0.5).astype(BF16)   # HF [out, in]
    return a, w, np.zeros((m, n), BF16)


@pytest.mark.parametrize("m,k,n", [(64, 256, 256), (16, 192, 96), (32, 1024, 64), (64, 8192, 512)])
def test_gemm_channel_traffic_and_result(m, k, n):
    """Per K step the segment puts one slice per herd row (A) and column (W), each reaching the whole
    row/column; every tile gets exactly its two tiles per step and puts its C tile once; the segment gets the
    C tiles into one L2 panel per herd row and writes each panel with one DMA. DDR traffic = panels + output;
    the result is a @ w^T (w in the HF [out, in] layout) within 2 bf16 ulps."""
    p, text = _gemm_program(m, k, n)
    launches = (m // p.bm) * (n // p.bn)
    steps, l2_steps = k // p.tile_k, k // p.tile_k_l2
    tiles = p.herd_m * p.herd_n
    a, w, c = _gemm_inputs(m, k, n)
    stats = air_interp.compile_module(text).run([a, w, c])
    assert stats.tiles == launches * tiles
    w_loads = p.herd_n * p.w_parts     # a herd column's W panel arrives in w_parts row parts (one DMA each)
    assert stats.channel_puts == launches * (steps * (p.herd_m + p.herd_n) + tiles)
    assert stats.channel_gets == launches * tiles * (2 * steps + 1)
    assert stats.dmas == launches * (l2_steps * (p.herd_m + w_loads) + p.herd_m)
    assert stats.dma_bytes == p.ddr_read_bytes(m, k, n) + 2 * m * n
    assert stats.calls_by_symbol == {f"gemm_{part}_bf16_m{p.tile_m}_k{p.tile_k}_n{p.tile_n}": launches * tiles * times
                                     for part, times in (("zero", 1), ("mac", steps), ("out", 1))}
    ref = KERNELS["gemm"](a, w, m=m, k=k, n=n).astype(np.float32)
    _assert_close([c.astype(np.float32)], [ref], "gemm")
    _assert_close([c.astype(np.float32)], [a.astype(np.float32) @ w.astype(np.float32).T], "gemm vs a @ w.T")


def _q_gemm_ops(text: str, op: str, chan: str):
    return list(re.finditer(rf"air\.channel\.{op} @q_gemm_{chan}\[(%\w+), (%\w+)\] \((%\w+)\[([^\]]*)\]", text))


def test_gemm_broadcast_index_mutation_is_detected(stitched, tmp_path):
    # the A panels of herd rows 0 and 1 of the q projection go out on each other's broadcast index
    text = stitched["qkv_s16"]
    puts = _q_gemm_ops(text, "put", "a")
    assert len(puts) >= 2, "the q GEMM should broadcast to at least two herd rows"
    (r0, r1) = puts[0].span(1), puts[1].span(1)
    i0, i1 = puts[0].group(1), puts[1].group(1)
    mutated = text[:r0[0]] + i1 + text[r0[1]:r1[0]] + i0 + text[r1[1]:]
    _check_mutation_detected(tmp_path, "qkv_s16", text, mutated, seed=13)


def test_gemm_drain_offset_mutation_is_detected(stitched, tmp_path):
    # herd column 1's C tile is drained onto herd column 0's columns of the L2 row panel
    text = stitched["qkv_s16"]
    gets = [g for g in _q_gemm_ops(text, "get", "c") if g.group(3).startswith("%q_c_l2")]
    assert len(gets) >= 2, "the q GEMM should drain at least two herd columns per row"
    second = gets[1]
    mutated = text[:second.start(4)] + gets[0].group(4) + text[second.end(4):]
    assert mutated != text
    _check_mutation_detected(tmp_path, "qkv_s16", text, mutated, seed=14)


def test_channel_get_without_put_and_unconsumed_put_fail():
    m, k, n = 32, 128, 64
    _, text = _gemm_program(m, k, n)
    data = list(_gemm_inputs(m, k, n))
    # herd row 1's A slice is put on row 0 instead: row 1's tiles wait forever
    idx = [mm for mm in re.finditer(r"air\.channel\.put @gemm_a\[(%\w+),", text)]
    moved = text[:idx[1].start(1)] + idx[0].group(1) + text[idx[1].end(1):]
    with pytest.raises(air_interp.InterpError, match=r"get on @gemm_a\[1, \d\] finds no data"):
        air_interp.compile_module(moved).run([x.copy() for x in data])
    # the herd no longer reads B: the segment's B puts are never consumed
    no_get = re.sub(r"\n\s*air\.channel\.get @gemm_b\[[^\n]*", "", text, count=1)
    with pytest.raises(air_interp.InterpError, match=r"unconsumed channel data: .*@gemm_b"):
        air_interp.compile_module(no_get).run([x.copy() for x in data])
