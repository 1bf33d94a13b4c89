"""The KV8 cache (int8 codes + power-of-two f32 scales per position and kv head; docs/quantization.md "KV cache"):
the format's numerics, the writer `kv_quant`, the decode attention `attention_kv8` and the prefill's `kv_dequant` - their AIE2P vector paths
on the host aie_api against the numpy references (writer bit exact; attention within the bf16 decode's bound) with
counts equal to the cost descriptors, off-by-one mutants that fail, the module texts on emu-interp (the writer
bit equal to its reference, the attention within one bf16 ulp), the plans and the hardware model at SmolLM2-135M / Llama-3.2-1B / 3B / Llama-3.1-8B shapes."""
from __future__ import annotations

import re

import numpy as np
import pytest

from external_kernels.paths import SOURCE_DIR
from kernel_builder import aie_host, aie_host_runs
from kernel_builder.aie_host_runs_kv8 import kv_rows_input
from kernel_builder.attention_kv8.external import COSTS as ATT_COSTS, step_counts
from kernel_builder.attention_kv8.plan import plan_attention_kv8
from kernel_builder.attention_kv8.reference import attention_kv8
from kernel_builder.instr_counts import Counts
from kernel_builder.kv_dequant.external import COSTS as KVD_COSTS
from kernel_builder.kv_dequant.reference import kv_dequant
from kernel_builder.kv_quant.external import COSTS as KVQ_COSTS
from kernel_builder.kv_quant.reference import dequantize, kv_quant, pack_rows, quantize, row_bytes
from kernel_builder.numerics import BF16, to_bf16
from kernel_builder.registry import kernel_text

KVQ_OBJS = ["kvq_r1_h8_d64.o", "kvq_r1_h3_d64.o", "kvq_r2_h8_d128.o"]
KVD_OBJS = ["kvd_r1_h8_d64.o", "kvd_r4_h3_d64.o"]
ATT_OBJS = ["attnk_hd64_q4_k64_n4.o", "attnk_hd64_q3_k32_n8.o", "attnk_hd128_q3_k32_n2.o"]


def test_format_is_exact_in_bf16_and_within_half_a_step():
    x = kv_rows_input(np.random.default_rng(0), 16, 8, 64)
    codes, scales = quantize(x, 8, 64)
    assert codes.dtype == np.int8 and scales.dtype == np.float32
    assert np.all(np.log2(scales) == np.round(np.log2(scales)))            # powers of two
    deq = dequantize(codes, scales, 8, 64)
    np.testing.assert_array_equal(to_bf16(deq).astype(np.float32), deq)     # code * scale is a bf16 value
    step = np.repeat(scales, 64, axis=1)
    err = np.abs(deq - x.astype(np.float32))
    assert np.all(err <= step / 2 + step * (np.abs(x.astype(np.float32)) >= 127.5 * step))  # saturation at 127
    amax = np.abs(x.astype(np.float32)).reshape(16, 8, 64).max(axis=2)
    nz = amax > 0
    assert np.all(np.abs(codes.reshape(16, 8, 64)).max(axis=2)[nz] >= 64)  # the largest value uses 7 bits
    assert np.all(codes.reshape(16, 8, 64)[~nz] == 0) and np.all(scales[~nz] == 1.0)


def test_writer_reference_keeps_the_other_half():
    rng = np.random.default_rng(1)
    k, v = kv_rows_input(rng, 4, 3, 64), kv_rows_input(rng, 4, 3, 64)
    rows = np.zeros((4, row_bytes(3, 64)), np.int8)
    rows = kv_quant(k, rows, rows=4, kv_heads=3, head_dim=64, half=0)
    rows = kv_quant(v, rows, rows=4, kv_heads=3, head_dim=64, half=1)
    np.testing.assert_array_equal(rows, pack_rows(k, v, 3, 64))
    with pytest.raises(ValueError, match="half must be 0"):
        kv_quant(k, rows, rows=4, kv_heads=3, head_dim=64, half=2)


@pytest.mark.parametrize("obj", KVQ_OBJS + KVD_OBJS + ATT_OBJS)
def test_vector_path_matches_reference_and_counts(obj):
    r = aie_host_runs.run(obj, np.random.default_rng(2))
    assert not aie_host_runs.mismatch(r), aie_host_runs.mismatch(r)
    sym = aie_host_runs.kernel_of(obj)
    if obj.startswith("kv"):
        cost = (KVQ_COSTS if obj.startswith("kvq") else KVD_COSTS)[0]
        formula = cost.work(cost.pattern.fullmatch(sym.symbol), []).counts
    else:   # the driver's first step: keys [0, lk) all visible
        hd, lq, lk = (int(g) for g in re.match(r"attnk_hd(\d+)_q(\d+)_k(\d+)", obj).groups())
        formula = step_counts(hd, lq, lk, lk - 1 + 10**6, 0)
        upd = sym.symbol.replace("_init_", "_step_")
        assert ATT_COSTS[1].pattern.fullmatch(upd)
    assert Counts._of(formula).host() == {k: n for k, n in r.counts.items() if n}


@pytest.mark.parametrize("pos,k0", [(0, 0), (5, 0), (63, 0), (70, 64), (200, 64)])
def test_attention_step_counts_at_causal_edges(pos, k0):
    from kernel_builder.aie_host_runs_kv8 import kv8_item
    from kernel_builder.attention_kv8.external import attention_kv8_kernels
    ks = attention_kv8_kernels(64, 4, 64, 1)
    lib = aie_host.load(ks.init)
    rng = np.random.default_rng(3)
    (kc, kss), (vc, vss) = quantize(kv_rows_input(rng, 128, 1, 64), 1, 64), quantize(kv_rows_input(rng, 128, 1, 64), 1, 64)
    q = to_bf16(rng.standard_normal((4, 64)).astype(np.float32))
    st = aie_host.aligned(np.empty(4 * 66, np.float32))
    lib.call(ks.init.symbol, st)
    item = aie_host.aligned(kv8_item(kc, vc, kss.reshape(-1), vss.reshape(-1), q, k0, 64))
    c = lib.call(ks.update.symbol, item, st, pos, k0)
    assert Counts._of(step_counts(64, 4, 64, pos, k0)).host() == {k: n for k, n in c.items() if n}


def _mutant(tmp_path, source, pattern, repl):
    text = (SOURCE_DIR / source).read_text()
    mutated, n = re.subn(pattern, repl, text)
    assert n == 1, pattern
    (tmp_path / source).write_text(mutated)
    return tmp_path / source


def test_off_by_one_in_the_attention_dequantization_fails(tmp_path):
    # attention.cc includes attention_kv8.h from its own folder: copy both, mutate the header
    (tmp_path / "attention.cc").write_text((SOURCE_DIR / "attention.cc").read_text())
    _mutant(tmp_path, "attention_kv8.h", r"const int8_t \*b = item \+ j \* kBlock;",
            "const int8_t *b = item + (j + 1) * kBlock;")
    obj = ATT_OBJS[0]
    lib = aie_host.load(aie_host_runs.kernel_of(obj), source=tmp_path / "attention.cc")
    assert aie_host_runs.mismatch(aie_host_runs.run(obj, np.random.default_rng(2), lib))


def test_off_by_one_in_the_writer_shift_fails(tmp_path):
    src = _mutant(tmp_path, "kv_quant.cc", r"const int s = 6 - \(static_cast", "const int s = 7 - (static_cast")
    obj = KVQ_OBJS[0]
    lib = aie_host.load(aie_host_runs.kernel_of(obj), source=src)
    assert aie_host_runs.mismatch(aie_host_runs.run(obj, np.random.default_rng(2), lib))


def test_off_by_one_in_the_dequantization_kernel_fails(tmp_path):
    src = _mutant(tmp_path, "kv_dequant.cc", r"const int8_t \*b = kv \+ r \* kRow \+ h \* kBlock;",
                  "const int8_t *b = kv + r * kRow + h * kBlock + 8;")
    obj = KVD_OBJS[1]
    lib = aie_host.load(aie_host_runs.kernel_of(obj), source=src)
    assert aie_host_runs.mismatch(aie_host_runs.run(obj, np.random.default_rng(2), lib))


def test_dequantization_module_on_the_interpreter():
    from multi_launch_builder.emulator import air_interp
    rng = np.random.default_rng(6)
    rows = pack_rows(kv_rows_input(rng, 64, 3, 64), kv_rows_input(rng, 64, 3, 64), 3, 64)
    k, v = np.zeros((64, 192), BF16), np.zeros((64, 192), BF16)
    air_interp.compile_module(kernel_text("kv_dequant", 64, 3, 64)).run([rows, k, v])
    wk, wv = kv_dequant(rows, rows=64, kv_heads=3, head_dim=64)
    np.testing.assert_array_equal(k, wk)
    np.testing.assert_array_equal(v, wv)


def test_writer_module_on_the_interpreter():
    from multi_launch_builder.emulator import air_interp
    rng = np.random.default_rng(4)
    for rows, heads, half in ((1, 8, 0), (48, 3, 1)):
        x = kv_rows_input(rng, rows, heads, 64)
        kv = rng.integers(-128, 128, size=(rows, row_bytes(heads, 64)), dtype=np.int8)
        want = kv_quant(x, kv, rows=rows, kv_heads=heads, head_dim=64, half=half)
        air_interp.compile_module(kernel_text("kv_quant", rows, heads, 64, half)).run([x, kv])
        np.testing.assert_array_equal(kv, want)


@pytest.mark.parametrize("pos", [0, 100, 255])
def test_attention_module_on_the_interpreter(pos):
    from multi_launch_builder.emulator import air_interp
    rng = np.random.default_rng(5)
    W, heads, kvh, hd = 256, 9, 3, 64
    rows = pack_rows(kv_rows_input(rng, W, kvh, hd), kv_rows_input(rng, W, kvh, hd), kvh, hd)
    rows[pos + 1:] = rng.integers(-128, 128, size=rows[pos + 1:].shape, dtype=np.int8)   # past the position: junk
    q = to_bf16(rng.standard_normal((1, heads * hd)).astype(np.float32))
    o = np.zeros((1, heads * hd), BF16)
    air_interp.compile_module(kernel_text("attention_kv8", 1, W, heads, kvh, hd)).run([q, rows, np.array([pos], np.int32), o])
    want = attention_kv8(q, rows, pos, rows=1, kv_rows=W, heads=heads, kv_heads=kvh, head_dim=hd).astype(np.float32)
    # the interpreter's model sums in the kernel's sequential f32 order, the reference in f64: one bf16 ulp
    np.testing.assert_allclose(o.astype(np.float32), want, rtol=2.0**-7, atol=2.0**-10 * np.abs(want).max())


def test_plans_and_limits():
    p = plan_attention_kv8(32768, 32, 8, 64)                      # Llama-3.2-1B at 32k: the bf16 decode's splits,
    # one kv head per launch iteration (128 tiles: 4 side by side would split the query rows' read: test_shim_bd_leak)
    assert (p.herd_x, p.herd_y) == (4, 1) and p.channels()["shim_mm2s"] == 13 and p.l1_bytes() <= 60 * 1024
    assert plan_attention_kv8(8192, 32, 8, 64).herd_y == 4        # 32 tiles: 4 kv heads side by side
    assert plan_attention_kv8(8192, 24, 8, 128).fits()
    with pytest.raises(ValueError, match="decode only"):
        kernel_text("attention_kv8", 2, 256, 9, 3, 64)
    with pytest.raises(ValueError, match="head_dim=48 must be a multiple of 32"):
        kernel_text("kv_quant", 1, 3, 48, 0)


@pytest.mark.parametrize("args", [("kv_dequant", 256, 8, 64), ("kv_dequant", 32768, 8, 64), ("kv_dequant", 2048, 3, 64),
                                  ("kv_quant", 1, 8, 64, 0), ("kv_quant", 512, 8, 64, 1), ("kv_quant", 2048, 3, 64, 0),
                                  ("attention_kv8", 1, 256, 9, 3, 64), ("attention_kv8", 1, 1024, 32, 8, 64),
                                  ("attention_kv8", 1, 32768, 32, 8, 64), ("attention_kv8", 1, 8192, 24, 8, 128),
                                  ("attention_kv8", 1, 8192, 32, 8, 128)])
def test_hardware_model_accepts(args):
    from kernel_builder.hw import analyze_module
    rep = analyze_module(kernel_text(*args))
    assert rep.ok, rep.first_violation()
