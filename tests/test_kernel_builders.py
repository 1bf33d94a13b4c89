"""Every kernel builder at the reference model shapes: AIR structure checks (tests/air_checks.py), upstream
mlir-opt-22 verification of everything that is not AIR custom syntax, and the llama_npu.kernel attribute."""
from __future__ import annotations

import os
import re
import shutil
import subprocess

import pytest

from kernel_builder.gemm import plan as gemm_plan
from kernel_builder import planner
from kernel_builder.add import builder as add
from kernel_builder.attention import builder as attention
from kernel_builder.gemm import builder as gemm
from kernel_builder.gemv import builder as gemv
from kernel_builder.rmsnorm import builder as rmsnorm
from kernel_builder.rope import builder as rope
from kernel_builder.swiglu import builder as swiglu
from llama_npu.models.llama import LLAMA32_1B, LLAMA32_3B, SMOLLM2_135M
from tests import air_checks, air_generic
from tests.tooling import require_tool

MODELS = {"llama32_1b": LLAMA32_1B, "llama32_3b": LLAMA32_3B, "smollm2_135m": SMOLLM2_135M}


def model_kernels(s, seq: int):
    """(builder call, expected llama_npu.kernel) for every kernel one layer uses at `seq` rows."""
    out = [
        (lambda: rmsnorm.build(seq, s.hidden, s.rms_eps),
         {"kind": "rmsnorm", "rows": seq, "dim": s.hidden, "eps": pytest.approx(s.rms_eps, rel=1e-6)}),
        (lambda: rope.build(seq, s.n_heads, s.head_dim),
         {"kind": "rope", "rows": seq, "heads": s.n_heads, "head_dim": s.head_dim}),
        (lambda: rope.build(seq, s.n_kv_heads, s.head_dim),
         {"kind": "rope", "rows": seq, "heads": s.n_kv_heads, "head_dim": s.head_dim}),
        (lambda: swiglu.build(seq, s.ffn), {"kind": "swiglu", "rows": seq, "dim": s.ffn}),
        (lambda: add.build(seq, s.hidden), {"kind": "add", "rows": seq, "dim": s.hidden, "flat_out": 0}),
        (lambda: add.build(seq, s.hidden, flat_out=True),
         {"kind": "add", "rows": seq, "dim": s.hidden, "flat_out": 1}),
    ]
    projections = [(s.hidden, s.q_dim), (s.hidden, s.kv_dim), (s.q_dim, s.hidden), (s.hidden, s.ffn),
                   (s.ffn, s.hidden)]
    heads = {"heads": s.n_heads, "kv_heads": s.n_kv_heads, "head_dim": s.head_dim}
    if seq == 1:
        for k, m in projections:
            out.append((lambda m=m, k=k: gemv.build(m, k), {"kind": "gemv", "m": m, "k": k}))
        windows = (256, 2048, 8192)      # decode attention over KV windows of the cache
    else:
        for k, n in projections:
            out.append((lambda k=k, n=n: gemm.build(seq, k, n), {"kind": "gemm", "m": seq, "k": k, "n": n}))
        windows = (seq, 8192)            # the first chunk over its own keys; a chunk over an 8k KV prefix
    for w in windows:
        out.append((lambda w=w: attention.build(seq, w, s.n_heads, s.n_kv_heads, s.head_dim),
                    {"kind": "attention", "rows": seq, "kv_rows": w, **heads}))
    return out


CASES = [(f"{name}-s{seq}-{i}", s, seq, i) for name, s in MODELS.items() for seq in (1, 64, 2048)
         for i in range(len(model_kernels(s, seq)))]


@pytest.fixture(scope="module")
def mlir_opt():
    return require_tool("mlir-opt-22")


def _generic_parse(mlir_opt: str, text: str) -> None:
    air_generic.mlir_opt_verify(mlir_opt, air_generic.to_generic(text))


@pytest.mark.parametrize("case,s,seq,i", CASES, ids=[c[0] for c in CASES])
def test_builder_structure(case, s, seq, i):
    build, expected = model_kernels(s, seq)[i]
    text = build()
    rep = air_checks.check_module(text)
    assert rep.errors == [], "\n".join(rep.errors)
    assert rep.kernels == [expected]
    assert len(rep.public) == 1 and rep.public[0][0] == expected["kind"]
    # every herd gets its data through operands or channels
    for h in rep.herds:
        assert h.types or rep.channel_ops, "herd without operands or channels"
    # the herd of every kernel fits the 8x4 array
    consts = {name: int(v) for name, v in re.findall(r"(%\S+) = arith\.constant (\d+) : index", text)}
    for h in rep.herds:
        x, y = (consts[v] for v in h.sizes)
        assert 1 <= x <= planner.NPU2_COLS and 1 <= y <= planner.NPU2_ROWS, (h.symbol, x, y)


@pytest.mark.parametrize("case,s,seq,i", [c for c in CASES if c[2] in (1, 64)], ids=[c[0] for c in CASES
                                                                                      if c[2] in (1, 64)])
def test_builder_mlir_opt(case, s, seq, i, mlir_opt):
    build, _ = model_kernels(s, seq)[i]
    text = build()
    _generic_parse(mlir_opt, text)
    air_generic.mlir_opt_verify(mlir_opt, air_generic.signature_module(text), unregistered=False)
    for _, mod in air_generic.herd_modules(text):
        air_generic.mlir_opt_verify(mlir_opt, mod)


@pytest.mark.parametrize("name", list(MODELS))
def test_builder_mlir_opt_seq2048_whole_module(name, mlir_opt):
    # one mlir-opt call per kernel (seq 2048 differs from seq 64 only in constants/plans)
    for build, _ in model_kernels(MODELS[name], 2048):
        _generic_parse(mlir_opt, build())


def test_signature_and_arg_types():
    s = LLAMA32_1B
    rep = air_checks.check_module(gemv.build(s.kv_dim, s.hidden))
    assert rep.public[0][2] == ["memref<512x2048xbf16>", "memref<1x2048xbf16>", "memref<1x512xbf16>"]
    rep = air_checks.check_module(add.build(64, 2048, flat_out=True))
    assert rep.public[0][2][-1] == "memref<131072xbf16>"
    rep = air_checks.check_module(attention.build(64, 256, 32, 8, 64))
    assert rep.public[0][2] == ["memref<64x2048xbf16>", "memref<256x512xbf16>", "memref<256x512xbf16>",
                                "memref<1xi32>", "memref<64x2048xbf16>"]
    rep = air_checks.check_module(rope.build(1, 8, 64))
    assert rep.public[0][2] == ["memref<1x512xbf16>", "memref<1x64xbf16>", "memref<1x512xbf16>"]


def test_bare_herds_and_launches():
    a = air_checks.check_module(add.build(64, 2048))
    assert [op.kind for op in a.air_ops] == ["air.herd"] and a.air_ops[0].func_level
    rms = air_checks.check_module(rmsnorm.build(64, 2048, 1e-5))   # the segment stages the weight in L2
    assert [op.kind for op in rms.air_ops] == ["air.launch", "air.segment", "air.herd"]
    g = air_checks.check_module(gemm.build(64, 2048, 512))
    assert [op.kind for op in g.air_ops] == ["air.launch", "air.segment", "air.herd"]


def _body(text: str, op) -> str:
    return text[op.header_span[1]:op.body_close]


GEMM_SHAPES = [(64, 576, 192), (64, 2048, 8192), (2048, 8192, 2048), (2048, 3072, 1024), (16, 576, 1536),
               (256, 2048, 512)]


@pytest.mark.parametrize("epilogue", ["none", "swiglu"])
@pytest.mark.parametrize("m,k,n", GEMM_SHAPES)
def test_gemm_structure_panels_drain_and_micro_kernel(m, k, n, epilogue, monkeypatch):
    # the streamed plan's structure (the A-resident module's: tests/test_gemm_resident.py)
    monkeypatch.setattr(gemm_plan, "A_RESIDENT", False)
    p = gemm_plan.plan_gemm(m, k, n, epilogue)
    k2, tm, tn, tk, parts = p.tile_k_l2, p.tile_m, p.tile_n, p.tile_k, p.w_parts
    text = gemm.build(m, k, n, epilogue)
    rep = air_checks.check_module(text)
    assert rep.errors == []
    w_rows = 2 * n if epilogue == "swiglu" else n   # swiglu: one weight, gate and up rows interleaved by 8
    assert rep.public[0][2] == [f"memref<{m}x{k}xbf16>", f"memref<{w_rows}x{k}xbf16>", f"memref<{m}x{n}xbf16>"]
    assert parts == 1   # every W panel is ONE L3 DMA (a two-load panel does not place: gemm_swiglu/layout.py)
    launch, seg, herd = rep.air_ops
    seg_body, herd_body = _body(text, seg), _body(text, herd)
    seg_outside_herd = seg_body.replace(herd_body, "")
    # the herd touches no L3 buffer: it has no operands at all (A/W arrive and C leaves over channels)
    assert herd.types == []
    assert "air.dma_memcpy_nd" not in herd_body
    # no linalg op is left anywhere (aircc would lower it to scalar loops): the micro-kernel does the math
    assert "linalg." not in text
    # L2: one A panel per herd row, w_parts W panel parts per herd column, one C row panel per herd row; each its
    # own allocation, each within one memory tile
    l2 = re.findall(r"memref\.alloc\(\) : memref<(\d+)x(\d+)xbf16, 1 : i32>", text)
    assert sorted(l2) == sorted([(str(tm), str(k2))] * p.herd_m + [(str(tn), str(k2))] * p.herd_n
                                + [(str(tm), str(p.bn_out))] * p.herd_m)
    assert all(2 * 2 * int(r) * int(c) <= planner.MEMTILE_BYTES for r, c in l2)
    # channels: A per herd row fans out over the herd's columns, W per column over its rows, C per tile
    ch = rep.channels
    assert (ch["gemm_a"].size, ch["gemm_a"].broadcast_shape) == \
        ([p.herd_m, 1], None if p.herd_n == 1 else [p.herd_m, p.herd_n])
    assert (ch["gemm_b"].size, ch["gemm_b"].broadcast_shape) == \
        ([1, p.herd_n], None if p.herd_m == 1 else [p.herd_m, p.herd_n])
    assert (ch["gemm_c"].size, ch["gemm_c"].broadcast_shape) == ([p.herd_m, p.herd_n], None)
    # segment: K loop over [0, k) in K2 steps with herd_m + herd_n * w_parts panel DMAs from L3, a slice loop over
    # the panel in tile_k steps (in 8-element blocks) with one put per panel; after the herd, one DMA per C row
    consts = {n_: int(v) for n_, v in re.findall(r"(%\S+) = arith\.constant (-?\d+) : index", text)}
    seg_loops = re.findall(r"scf\.for %\S+ = %\S+ to (%\S+) step (%\S+) \{", seg_outside_herd)
    assert [(consts[a], consts[b]) for a, b in seg_loops] == [(k, k2), (k2 // 8, tk // 8)]
    assert seg_outside_herd.count("air.dma_memcpy_nd") == 2 * p.herd_m + p.herd_n * parts
    puts = [a for a in rep.channel_ops if a.kind == "put"]
    assert {a.symbol: a.region for a in puts} == {"gemm_a": "air.segment", "gemm_b": "air.segment",
                                                  "gemm_c": "air.herd"}
    a_puts = sorted(tuple(consts[v] for v in a.indices) for a in puts if a.symbol == "gemm_a")
    b_puts = sorted(tuple(consts[v] for v in a.indices) for a in puts if a.symbol == "gemm_b")
    assert a_puts == [(i, 0) for i in range(p.herd_m)]
    assert b_puts == [(0, j) for j in range(p.herd_n)]
    for a in puts:
        if a.symbol != "gemm_c":  # 8x8 re-blocking of a [rows, tile_k] slice; innermost run 8 contiguous bf16
            r = tm if a.symbol == "gemm_a" else tn
            assert [consts[v] for v in a.lists[1]] == [r // 8, tk // 8, 8, 8]
            assert [consts[v] for v in a.lists[2]] == [8 * k2, 8, k2, 1]
    # herd: zero, the whole K reduction in one loop (two gets + one mac call), the epilogue, one C put
    # of the bf16 tile the epilogue wrote in place over the accumulator's front
    loops = re.findall(r"scf\.for %\S+ = %\S+ to (%\S+) step (%\S+) \{", herd_body)
    assert [(consts[a], consts[b]) for a, b in loops] == [(k, tk)]
    calls = re.findall(r"func\.call @(\w+)\(", herd_body)
    tag = f"m{tm}_k{tk}_n{tn}"
    epi = "glu" if epilogue == "swiglu" else "out"
    assert calls == [f"gemm_zero_bf16_{tag}", f"gemm_mac_bf16_{tag}", f"gemm_{epi}_bf16_{tag}"]
    loop_body = herd_body[herd_body.index("scf.for"):herd_body.index(f"func.call @gemm_{epi}")]
    assert f"func.call @gemm_mac_bf16_{tag}" in loop_body and "gemm_zero" not in loop_body
    gets = [a for a in rep.channel_ops if a.kind == "get"]
    assert [(a.symbol, a.indices, a.type) for a in gets if a.region == "air.herd"] == \
        [("gemm_a", herd.ids, f"memref<{tm * tk}xbf16,2:i32>"), ("gemm_b", herd.ids, f"memref<{tn * tk}xbf16,2:i32>")]
    (c_put,) = [a for a in puts if a.symbol == "gemm_c"]
    assert [consts[v] for v in c_put.lists[1]] == [tm * p.out_n]
    assert herd.attrs["link_with"] == f"gemm_{tag}.o"
    _check_gemm_w_loads_and_drain(p, n, text, seg_outside_herd, consts, gets)


def _check_gemm_w_loads_and_drain(p, n: int, text: str, seg_outside_herd: str, consts: dict, gets: list) -> None:
    """The GEMM segment's W panel loads and its drain of the C tiles to L3 (test_gemm_structure_...)."""
    k2, tm, tn, parts, rows = p.tile_k_l2, p.tile_m, p.tile_n, p.w_parts, p.part_rows
    # W panel loads: w_parts DMAs per panel, part q into rows [q*rows, +rows)
    w_dmas = re.findall(r"air\.dma_memcpy_nd \((%w_l2\w*)\[([^\]]*)\]", seg_outside_herd)
    assert len(w_dmas) == p.herd_n * parts
    srcs = re.findall(r"air\.dma_memcpy_nd \(%w_l2\w*\[[^\]]*\] \[[^\]]*\] \[[^\]]*\], %\w+\[[^\]]*\] \[([^\]]*)\]",
                      seg_outside_herd)
    assert [[consts[v] for v in x.split(", ")] for x in srcs] == [[tn, k2]] * p.herd_n   # tn contiguous rows
    if parts > 1:
        assert sorted(consts[o.split(", ")[0]] for _, o in w_dmas) == sorted([q * rows for q in range(parts)] * p.herd_n)
    # drain: the segment gets tile (i, j) into row panel i at column block j*out_n/8, un-blocking 8x8
    drains = [a for a in gets if a.symbol == "gemm_c"]
    assert sorted(tuple(consts[v] for v in a.indices) for a in drains) == \
        [(i, j) for i in range(p.herd_m) for j in range(p.herd_n)]
    for a in drains:
        assert a.region == "air.segment"
        assert [consts[v] for v in a.lists[0]] == [0, consts[a.indices[1]] * p.out_n // 8, 0, 0]
        assert [consts[v] for v in a.lists[2]] == [8 * p.bn_out, 8, p.bn_out, 1]
    c_arg = "%sa_2"
    if p.spread:   # herd column j's piece at column j*n/herd_n
        out = re.findall(rf"air\.dma_memcpy_nd \(({c_arg})\[[^\]]*\] \[(%\w+), (%\w+), (%\w+)\] "
                         rf"\[(%\w+), (%\w+), %\w+\], %c_l2", text)
        assert [tuple(consts[v] for v in o[1:]) for o in out] == [(tm, p.herd_n, p.out_n, n, n // p.herd_n)] * p.herd_m
    else:
        out = re.findall(rf"air\.dma_memcpy_nd \(({c_arg})\[[^\]]*\] \[(%\w+), (%\w+)\] \[(%\w+), %\w+\], %c_l2",
                         text)
        assert [(consts[r], consts[c], consts[st]) for _, r, c, st in out] == [(tm, p.bn_out, n)] * p.herd_m


def test_gemm_panels_cut_ddr_reads(monkeypatch):
    """Broadcasting the L2 panels reads A n/BN times and W m/BM times (was n/tile_n and m/tile_m); with A resident
    in L2, A once."""
    m, k, n = 2048, 2048, 8192
    r = gemm_plan.plan_gemm(m, k, n)
    assert r.a_resident and r.ddr_read_bytes(m, k, n) == 2 * (m * k + k * n * (m // r.bm))
    monkeypatch.setattr(gemm_plan, "A_RESIDENT", False)
    p = gemm_plan.plan_gemm(m, k, n)
    assert p.ddr_read_bytes(m, k, n) == 2 * (m * k * (n // p.bn) + k * n * (m // p.bm))
    g = gemm_plan.plan_gemm(m, k, n, "swiglu")   # two weights, each read m/BM times; A n/bn_out times
    assert g.ddr_read_bytes(m, k, n) == 2 * (m * k * (n // g.bn_out) + 2 * k * n * (m // g.bm))
    per_tile = 2 * (m * k * (n // p.tile_n) + k * n * (m // p.tile_m))
    assert p.ddr_read_bytes(m, k, n) * min(p.herd_m, p.herd_n) <= per_tile


def test_gemv_k_variants_have_distinct_symbols():
    a = air_checks.check_module(gemv.build(2048, 2048))
    b = air_checks.check_module(gemv.build(2048, 8192))
    assert set(a.decls).isdisjoint(b.decls)
    for rep in (a, b):
        (decl,) = [d for ds in rep.decls.values() for d in ds]
        assert rep.herds[0].attrs["link_with"] == decl.attrs["link_with"]


def test_attention_prefill_and_decode_are_distinct_designs():
    """Prefill: one herd whose cores all share one broadcast item stream and drain their output tiles through
    L2; decode: the split herd (kv heads side by side) and its merge herd."""
    pre = air_checks.check_module(attention.build(64, 64, 32, 8, 64))
    dec = air_checks.check_module(attention.build(1, 2048, 32, 8, 64))
    assert [h.symbol for h in pre.herds] == ["attention_herd"]
    assert [h.symbol for h in dec.herds] == ["attention_herd", "attention_merge"]
    assert pre.channels["attn_in"].broadcast_shape == [4, 4] and pre.channels["attn_in"].size == [1, 1]
    assert pre.channels["attn_o"].size == [4, 4] and pre.channels["attn_o"].broadcast_shape is None
    assert dec.channels["attn_in"].broadcast_shape is None and dec.channels["attn_in"].size == [4, 4]
    assert dec.channels["attn_merge"].size == [1, 4]
    for rep in (pre, dec):
        assert rep.errors == [] and rep.kernels[0]["kind"] == "attention"


def test_generation_is_deterministic():
    """The same shapes give byte-identical text (the build cache keys on it); speed is a bench figure."""
    for seq in (1, 2048):
        for build, _ in model_kernels(LLAMA32_1B, seq):
            assert build() == build()


@pytest.mark.parametrize("bad", [
    lambda: rmsnorm.build(0, 2048, 1e-5),
    lambda: rmsnorm.build(4, 2048, 0.0),
    lambda: gemm.build(64, 2048, 0),
    lambda: gemv.build(2048, 100),
    lambda: rope.build(4, 8, 63),
    lambda: attention.build(64, 64, 30, 8, 64),
    lambda: attention.build(64, 64, 32, 8, 63),
    lambda: attention.build(1, 100, 32, 8, 64),
    lambda: swiglu.build(1, 8190),
    lambda: add.build(-1, 8),
])
def test_bad_shapes_raise_value_error(bad):
    with pytest.raises(ValueError):
        bad()


# --- the checker itself must catch broken modules -------------------------------------------------------
def _mutate(text: str, old: str, new: str) -> str:
    assert old in text, old
    return text.replace(old, new, 1)


def test_checker_catches_errors():
    good = gemv.build(512, 2048)
    assert air_checks.check_module(good).errors == []
    broken = {
        "args count": _mutate(good, "args(%ha=%sa) :", "args(%ha=%sa, %ha_1=%sa) :"),
        "bound type": _mutate(good, "args(%la=%arg0, %la_1=%arg1", "args(%la=%arg1, %la_1=%arg0"),
        "isolation": _mutate(good, "air.dma_memcpy_nd (%ha[", "air.dma_memcpy_nd (%la_2["),
        "memory space": _mutate(good, "memref.alloc() : memref<2048xbf16, 2 : i32>",
                                "memref.alloc() : memref<2048xbf16, 1 : i32>"),
        "link_with": _mutate(good, 'attributes {link_with = "mv_k2048', 'attributes {link_with = "other'),
        "kernel attr": _mutate(good, "llama_npu.kernel", "other.kernel"),
        "undefined": _mutate(good, "arith.addi %t, %ty", "arith.addi %nope, %ty"),
    }
    for what, text in broken.items():
        assert air_checks.check_module(text).errors, f"checker missed: {what}"
    rep = air_checks.check_module(good, expect_kernels=[{"kind": "gemv", "m": 512, "k": 4096}])
    assert rep.errors


def test_mlir_opt_catches_type_errors(mlir_opt):
    good = gemm.build(64, 576, 192)
    bad = _mutate(good, "func.call @gemm_zero_bf16_m8_k64_n48(%acc_l1) : (memref<768xbf16",
                  "func.call @gemm_zero_bf16_m8_k64_n48(%acc_l1) : (memref<760xbf16")
    with pytest.raises(AssertionError):
        _generic_parse(mlir_opt, bad)


def test_air_opt_if_available():
    air_opt = os.environ.get("AIR_OPT")
    if not air_opt:
        pytest.skip("AIR_OPT not set (no air-opt on this machine)")
    assert shutil.which(air_opt) or os.path.exists(air_opt)
    s = LLAMA32_1B
    for seq in (1, 64):
        for build, _ in model_kernels(s, seq):
            res = subprocess.run([air_opt, "-"], input=build(), capture_output=True, text=True, timeout=120)
            assert res.returncode == 0, res.stderr


def test_checker_catches_channel_mistakes(mlir_opt):
    good = gemm.build(64, 576, 192)
    assert air_checks.check_module(good).errors == []
    # the generic form keeps the channels and their put/get operands (mlir-opt parses them)
    generic = air_generic.to_generic(good)
    assert '"air.channel"() {sym_name = "gemm_a"' in generic and '"air.channel.get"(%tx, %ty, %a_l1)' in generic
    air_generic.mlir_opt_verify(mlir_opt, generic)
    mutations = {
        "undeclared channel": good.replace("air.channel.put @gemm_b[", "air.channel.put @gemm_x[", 1),
        "wrong rank": re.sub(r"air\.channel\.get @gemm_a\[%tx, %ty\]", "air.channel.get @gemm_a[%tx]", good),
        "no get": re.sub(r"\n\s*air\.channel\.get @gemm_b\[[^\n]*", "", good),
        "bad broadcast": good.replace("air.channel @gemm_a [", "air.channel @gemm_a [3, ", 1),
        "declared twice": good.replace("  air.channel @gemm_b", "  air.channel @gemm_a [8, 1]\n  air.channel @gemm_b", 1),
        "buffer type": good.replace("(%a_l1[] [] []) : (memref<", "(%a_l1[] [] []) : (memref<9x", 1),
        "channel in func": good.replace("    %c1 = arith.constant 1 : index",
                                        "    %c1 = arith.constant 1 : index\n    air.channel @late [1, 1]", 1),
    }
    for what, text in mutations.items():
        assert text != good, what
        assert air_checks.check_module(text).errors, f"checker missed: {what}"


def test_mlir_check_lifts_gemm_herd_with_channel_gets(mlir_opt):
    from kernel_builder import mlir_check
    text = gemm.build(64, 576, 192)
    funcs, notes = mlir_check.herd_functions(text)
    assert notes == [] and len(funcs) == 1
    assert "air." not in funcs[0] and "func.call @gemm_mac_bf16_m8_k64_n48" in funcs[0]
    res = mlir_check.check_text(text, tool=mlir_opt)
    assert res.ok and res.checked_herds == 1, res.stderr
