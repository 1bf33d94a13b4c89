"""gemm_bfp with its A operand at rest in block float (a="bfp16", kernel_builder/gemm/a_bfp.py): the planner
counts A in 72-byte blocks everywhere (L1 without the conversion scratch, L2 panels, shim flows, the core's L1
stream, DDR bytes) and picks faster plans for the Llama-3.2-1B prefill GEMMs; a="bf16" modules are unchanged; the
maca entry point's AIE2P vector path (host aie_api) reads the encoded A and W tiles and gives the bits of the
in-core conversion path, its counts equal the descriptor, an A block stride off by one fails; the scalar path
equals its numpy model; emu-interp (streamed and resident plans) and emu equal the reference bit for bit; the
hardware model accepts the 2048-row modules and rejects a broken A slice; bad formats give one clear error."""
from __future__ import annotations

import re

import numpy as np
import pytest

from external_kernels.paths import SOURCE_DIR
from kernel_builder import aie_host, block_float
from kernel_builder.aie_host_runs import unblock
from kernel_builder.external_costs import external_cost
from kernel_builder.gemm import builder as gemm_builder, plan as gemm_plan
from kernel_builder.gemm_bfp import external as bfp_ext
from kernel_builder.gemm_bfp.reference import gemm_bfp
from kernel_builder.instr_counts import Counts
from kernel_builder.numerics import BF16, to_bf16
from tests.test_gemm_bfp import TILES, _case, _rand, _run_bfp, _w_slice
from tooling import require_tool

A = aie_host.aligned
LLAMA_1B = [(2048, 2048, 8192, "swiglu"), (2048, 8192, 2048, "none"), (2048, 2048, 2048, "none")]


def _run_maca(t, a, wb, lib=None):
    """zero, one maca per K step on the encoded A and W tiles (the DMA order: gemm_bfp/external.py a_tile), out."""
    tm, tk, tn = t
    ks = bfp_ext.gemm_bfp_kernels(*t, a="bfp16")
    lib = lib or aie_host.load(ks.mac)
    ab = block_float.encode(a)
    acc = A(np.full(2 * tm * tn, np.nan, BF16))
    lib.call(ks.zero.symbol, acc)
    counts = None
    for s in range(a.shape[1] // tk):
        c = lib.call(ks.mac.symbol, A(bfp_ext.a_tile(ab, tm, tk, s)), A(_w_slice(wb, tk, s)), acc)
        counts = counts or c
    lib.call(ks.out.symbol, acc)
    return unblock(acc[:tm * tn], tm, tn), counts


def test_plans_count_a_in_block_float_and_are_faster(capsys):
    for m, k, n, epi in LLAMA_1B:
        p = gemm_plan.plan_gemm(m, k, n, epi, w_format="bfp16")
        q = gemm_plan.plan_gemm(m, k, n, epi, w_format="bfp16", a_format="bfp16")
        assert q.a_format == "bfp16" and q.l1_buffers()["a_bfp16"] == 0 and q.l1_bytes() <= gemm_plan.L1_BUDGET
        assert q.a_bytes(m, k) * 16 == p.a_bytes(m, k) * 9 == 9 * 2 * m * k
        assert q.l2_buffers()["a_panel"] == q.a_bytes(q.tile_m, q.k if q.a_resident else
                                                      q.copies(q.tile_k_l2) * q.tile_k_l2)
        a_flows = [f for f in gemm_plan.gemm_flows(q, m, k, n) if f.what == "a"]
        assert sum(f.bytes for f in a_flows) == q.a_bytes(m, k) * (1 if q.a_resident else n // q.bn_out)
        before, after = gemm_plan.modeled_seconds(p, m, k, n), gemm_plan.modeled_seconds(q, m, k, n)
        with capsys.disabled():
            print(f"\n{m}x{k}x{n} {epi}: A bf16 {before * 1e3:.2f} ms ({p.tile_m}x{p.tile_k}x{p.tile_n}) -> A bfp16 "
                  f"{after * 1e3:.2f} ms ({q.tile_m}x{q.tile_k}x{q.tile_n}{' resident' if q.a_resident else ''})")
        assert after < 0.85 * before
    # the freed L1 (no scratch, 9/16 of the A tiles) admits the 128-row tile for gate/up
    assert gemm_plan.plan_gemm(2048, 2048, 8192, "swiglu", w_format="bfp16", a_format="bfp16").tile_m == 128


def test_bf16_a_module_texts_unchanged():
    from kernel_builder.gemm_bfp.builder import build
    for args in ((64, 576, 192), (256, 576, 1536, "swiglu")):
        text = build(*args)
        assert text == build(*args, a="bf16") and "a_bfp" not in text and "maca" not in text
        bfp = build(*args, a="bfp16")
        m, k = args[0], args[1]
        assert "a_bfp = 1" in bfp and f"memref<{m // 8}x{9 * k}xi8>" in bfp and "gemm_bfp_maca_bf16" in bfp
        assert "bfp_l1" not in bfp   # no conversion scratch


@pytest.mark.parametrize("bad", [dict(a="fp8"), dict(a="bfp16", w="bf16")])
def test_bad_a_format_is_one_clear_error(bad):
    from kernel_builder.gemm.external import gemm_kernels
    from kernel_builder.gemm_bfp.builder import build
    if "w" in bad:
        with pytest.raises(ValueError, match=r"^gemm: A in block float needs W in block float"):
            gemm_plan.plan_gemm(64, 576, 192, w_format=bad["w"], a_format=bad["a"])
        with pytest.raises(ValueError, match=r"^gemm: A in block float needs W in block float"):
            gemm_kernels(8, 64, 48, bad["w"], bad["a"])
        return
    for call in (lambda: build(64, 576, 192, a="fp8"), lambda: gemm_kernels(8, 64, 48, "bfp16", "fp8")):
        with pytest.raises(ValueError, match=re.escape("gemm: unknown A format 'fp8' (known: bf16, bfp16)")):
            call()


@pytest.mark.parametrize("t", TILES, ids=lambda t: "m{}_k{}_n{}".format(*t))
def test_vector_path_reads_encoded_a_and_counts(t):
    require_tool("g++")
    a, w = _case(t)
    wb = block_float.encode(w)
    got, counts = _run_maca(t, a, wb)
    # the in-core conversion of a bf16 A rounds like block_float.encode: the same operands, the same loop, the bits
    np.testing.assert_array_equal(got, _run_bfp(t, a, wb)[0])
    cost = bfp_ext.COSTS[2]
    sym = bfp_ext.gemm_bfp_kernels(*t, a="bfp16").mac.symbol
    assert cost.pattern.fullmatch(sym)
    formula = cost.work(cost.pattern.fullmatch(sym), []).counts
    assert Counts._of(formula).host() == {kind: v for kind, v in counts.items() if v}
    tm, tk, tn = t
    assert "bfp16_convert" not in counts or counts["bfp16_convert"] == 0     # nothing converted in the core
    assert counts["mmul_bfp16_8x8x8"] == tm * tk * tn // 512


A_MUTANTS = [  # the A chunk's first block one block off; A read one row (9 bytes) off
    ("gemm.cc", r"\? \(c \* kMB \+ mb\) \* kWC :", "? (c * kMB + mb) * kWC + c :"),
    ("gemm_bfp.cc", r"mac_bfp_blocks<true>\(reinterpret_cast<bfp16ebs8 \*>\(a\)",
     "mac_bfp_blocks<true>(reinterpret_cast<bfp16ebs8 *>(a + 9)"),
]


@pytest.mark.parametrize("mutant", A_MUTANTS, ids=["a_chunk_seek", "a_row_offset"])
def test_a_block_stride_off_by_one_fails(tmp_path, mutant):
    require_tool("g++")
    name, pattern, repl = mutant
    for dep in ("gemm_bfp.cc", "gemm.cc", "kernel_common.h"):
        (tmp_path / dep).write_text((SOURCE_DIR / dep).read_text())
    mutated, n = re.subn(pattern, repl, (tmp_path / name).read_text())
    assert n >= 1
    (tmp_path / name).write_text(mutated)
    t = TILES[1]                                             # two K chunks per tile
    a, w = _case(t)
    wb = block_float.encode(w)
    lib = aie_host.load(bfp_ext.gemm_bfp_kernels(*t, a="bfp16").mac, source=tmp_path / "gemm_bfp.cc")
    try:
        got, _ = _run_maca(t, a, wb, lib)
    except aie_host.AieHostError:
        return
    assert not np.array_equal(got, _run_bfp(t, a, wb)[0])


def test_scalar_path_equals_its_numpy_model(tmp_path):
    import ctypes
    import subprocess
    from external_kernels import compile_rules
    from kernel_builder.externals import external_model
    from multi_launch_builder.emulator.air_interp import MemRef
    cxx = require_tool("g++")
    t = tm, tk, tn = TILES[1]
    ks = bfp_ext.gemm_bfp_kernels(*t, a="bfp16")
    subprocess.run(compile_rules.host_compile_command(ks.mac, tmp_path, cxx=cxx), check=True)
    so = tmp_path / "k.so"
    subprocess.run(compile_rules.host_link_command([tmp_path / compile_rules.host_object_name(ks.mac)], so, cxx=cxx),
                   check=True)
    lib = ctypes.CDLL(str(so))
    p = lambda x: x.ctypes.data_as(ctypes.c_void_p)   # noqa: E731
    a, w = _case(t)
    ab, wb = block_float.encode(a), block_float.encode(w)
    acc = np.zeros(2 * tm * tn, BF16)
    macc = MemRef(acc.copy(), acc.shape, "bf16")
    model = external_model(ks.mac.symbol)
    for s in range(a.shape[1] // tk):
        at, wt = bfp_ext.a_tile(ab, tm, tk, s), _w_slice(wb, tk, s)
        getattr(lib, ks.mac.symbol)(p(at), p(wt), p(acc))
        model(MemRef(at.view(np.int8).copy(), at.shape, "i8"), MemRef(wt.view(np.int8).copy(), wt.shape, "i8"), macc)
        np.testing.assert_array_equal(acc.view(np.uint16), macc.data.view(np.uint16))
    got = to_bf16(unblock(acc.view(np.float32), tm, tn))
    want = gemm_bfp(ab, wb, m=tm, k=a.shape[1], n=tn, a_bfp=1)
    np.testing.assert_array_equal(got, want)   # exact products, the sums agree here to the last bf16 bit


def _module(m, k, n, epi, resident: bool, monkeypatch):
    """The a="bfp16" module on the streamed or the resident plan of the planner's tiles (forced)."""
    real = gemm_plan.plan_gemm
    p = real(m, k, n, epi, w_format="bfp16", a_format="bfp16")
    q = gemm_plan.GemmPlan(p.tile_m, p.tile_k, p.tile_n, p.herd_m, p.herd_n, k=k, epilogue=epi, a_resident=resident,
                           w_format="bfp16", a_format="bfp16")
    assert gemm_plan._gemm_fits(q, k)
    monkeypatch.setattr(gemm_builder.gemm_plan, "plan_gemm", lambda *a, **kw: q)
    text = gemm_builder.build(m, k, n, epi, "bfp16", "bfp16")
    monkeypatch.setattr(gemm_builder.gemm_plan, "plan_gemm", real)
    return text


@pytest.mark.parametrize("resident", [False, True], ids=["streamed", "resident"])
@pytest.mark.parametrize("m,k,n,epi", [(64, 576, 192, "none"), (128, 256, 128, "swiglu")])
def test_module_on_emu_interp_and_emu_bit_exact(m, k, n, epi, resident, monkeypatch, tmp_path):
    from multi_launch_builder.emulator import air_interp
    from multi_launch_builder.emulator.launch_program import ReferenceExecutor, read_launch_program, run_program
    glu = epi == "swiglu"
    rng = np.random.default_rng(7 + m + resident)
    a, w = _rand(rng, (m, k)), _rand(rng, ((1 + glu) * n, k), 0.2)
    ab, wb = block_float.encode(a).view(np.int8), block_float.encode(w).view(np.int8)
    text = _module(m, k, n, epi, resident, monkeypatch)
    assert ("scf.for %na" in text) == resident
    want = gemm_bfp(ab, wb, m=m, k=k, n=n, glu=int(glu), a_bfp=1)
    c = np.zeros((m, n), BF16)
    air_interp.compile_module(text).run([ab, wb, c])
    np.testing.assert_array_equal(c, want)
    bufs = [ab, wb, np.zeros((m, n), BF16)]
    run_program(read_launch_program(text), bufs, ReferenceExecutor())
    np.testing.assert_array_equal(np.asarray(bufs[2]).reshape(m, n), want)
    if resident and not glu:   # the emu devices (i8 buffers, the a_bfp attribute to the reference)
        from multi_launch_builder.devices.base import Artifact
        from multi_launch_builder.devices.emu import EmuDevice
        path = tmp_path / "gemm_bfp.mlir"
        path.write_text(text)
        device = EmuDevice()
        handle = device.load(Artifact(name="gemm_bfp", mlir=path))
        dbufs = []
        for x in (ab, wb, np.zeros((m, n), BF16)):
            dbufs.append(device.alloc(x.nbytes))
            device.write(dbufs[-1], x)
        device.run(handle, dbufs)
        np.testing.assert_array_equal(device.read(dbufs[-1], (m, n), BF16), want)


def test_module_runs_the_vector_path_on_the_interpreter(monkeypatch):
    """emu-interp with LLAMA_NPU_EXTERNALS=aie-host: the herd's maca calls run gemm_bfp.cc's AIE2P path on the L1
    A and W tiles the module's DMAs cut from the at-rest bytes: the reference's result within the block-float
    model's accumulation-order slack."""
    from multi_launch_builder.emulator import air_interp
    require_tool("g++")
    m, k, n = 64, 576, 192
    text = _module(m, k, n, "none", True, monkeypatch)
    monkeypatch.setenv("LLAMA_NPU_EXTERNALS", "aie-host")
    rng = np.random.default_rng(12)
    a, w = _rand(rng, (m, k)), _rand(rng, (n, k), 0.2)
    ab, wb = block_float.encode(a).view(np.int8), block_float.encode(w).view(np.int8)
    c = np.zeros((m, n), BF16)
    air_interp.compile_module(text).run([ab, wb, c])
    want = gemm_bfp(ab, wb, m=m, k=k, n=n, a_bfp=1).astype(np.float64)
    assert np.all(np.abs(c.astype(np.float64) - want) <= 2.0**-8 * np.abs(want) + 2.0**-12 * np.abs(want).max())


def test_module_refuses_a_bf16_activation():
    from multi_launch_builder.emulator import air_interp
    from kernel_builder.registry import kernel_text
    m, k, n = 64, 576, 192
    mod = air_interp.compile_module(kernel_text("gemm_bfp", m, k, n, a="bfp16"))
    w = np.zeros((n // 8, 9 * k), np.int8)
    with pytest.raises(ValueError, match=re.escape("gemm_bfp: argument %arg0")):
        mod.run([np.zeros((m, k), BF16), w, np.zeros((m, n), BF16)])


@pytest.mark.parametrize("m,k,n,epi", LLAMA_1B + [(2048, 2048, 512, "none")])
def test_hardware_model_accepts(m, k, n, epi):
    from kernel_builder.hw import analyze_module, cost
    from kernel_builder.hw.tune import runtime_tiling
    from kernel_builder.presets import AirccPreset
    from kernel_builder.registry import kernel_text
    reps = {}
    for a in ("bf16", "bfp16"):
        text = kernel_text("gemm_bfp", m, k, n, epi, a=a)
        reps[a] = analyze_module(text, preset=AirccPreset(runtime_loop_tiling_sizes=runtime_tiling(text)))
        assert reps[a].ok, reps[a].first_violation()
    (la,), (lb,) = reps["bfp16"].launches, reps["bf16"].launches
    assert cost.launch_cost(la.work).total_s < 0.9 * cost.launch_cost(lb.work).total_s


def test_hardware_model_rejects_an_unchunked_resident_panel(monkeypatch):
    """The resident A panel written chunk-major in K chunks of tile_k = 64 columns (no bfp_chunk_k): its write has a
    576-byte dim, beyond NPU2.bd_max_size (the real lowering refuses it too: air-to-aie "'aie.dma_bd' op Size may
    not exceed 1023"); the hardware model must reject it."""
    from kernel_builder.gemm import a_bfp
    from kernel_builder.hw import analyze_module
    good = _module(256, 576, 576, "none", True, monkeypatch)
    assert analyze_module(good).ok
    monkeypatch.setattr(a_bfp, "bfp_chunk_k", lambda tile_k: tile_k)
    text = _module(256, 576, 576, "none", True, monkeypatch)
    assert text != good
    assert not analyze_module(text).ok


def _model_shapes(rows: int) -> list:
    """q/o, k/v, gate/up+swiglu and down of Llama-3.2-1B, SmolLM2-135M and Llama-3.2-3B at `rows` rows."""
    out = []
    for hidden, kv, ffn in ((2048, 512, 8192), (576, 192, 1536), (3072, 1024, 8192)):
        out += [(rows, hidden, hidden, "none"), (rows, hidden, kv, "none"), (rows, hidden, ffn, "swiglu"),
                (rows, ffn, hidden, "none")]
    return out


LOWER_CASES = _model_shapes(2048) + [s for r in (64, 256, 1024) for s in _model_shapes(r)[:4]]


@pytest.mark.skipif(not __import__("os").environ.get("LLAMA_NPU_AIR_LOWER"),
                    reason="LLAMA_NPU_AIR_LOWER not set (no mlir-air/mlir-aie lowering here)")
@pytest.mark.parametrize("shape", LOWER_CASES, ids=lambda s: "x".join(map(str, s[:3])) + "_" + s[3])
def test_real_lowering(tmp_path, shape):
    """The a="bfp16" modules through the real pipeline with the hardware model's runtime loop tiling (as
    `llama-npu check-lowering` lowers them)."""
    import os
    from kernel_builder.hw.tune import runtime_tiling
    from kernel_builder.presets import AirccPreset
    from kernel_builder.registry import kernel_text
    from multi_launch_builder.compile.lowering import lower_with_tool
    text = kernel_text("gemm_bfp", *shape, a="bfp16")
    src = tmp_path / "gemm_bfp.mlir"
    src.write_text(text)
    preset = AirccPreset(runtime_loop_tiling_sizes=runtime_tiling(text))
    res = lower_with_tool(os.environ["LLAMA_NPU_AIR_LOWER"], src, tmp_path / "out", preset.flags(), timeout=1800)
    assert res.ok, f"{res.stage}: {res.message}"


def test_maca_symbol_finds_its_kind():
    from kernel_builder.externals import family_of_symbol
    from kernel_builder.registry import spec
    sym = bfp_ext.gemm_bfp_kernels(64, 64, 64, a="bfp16").mac.symbol
    assert sym == "gemm_bfp_maca_bf16_m64_k64_n64"
    assert family_of_symbol(sym)[0] is spec("gemm_bfp").families[0]
    assert external_cost(sym)[0] is bfp_ext.COSTS[2] and external_cost(sym)[0].writes == (2,)
