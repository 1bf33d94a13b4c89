"""Every kernel builder at the reference model shapes: AIR structure checks (tests/air_checks.py), upstream
mlir-opt-22 verification of everything that is not AIR custom syntax, and the llama_npu.kernel attribute."""
from __future__ import annotations

import os
import re
import shutil
import subprocess

import pytest

from kernel_builder import planner
from kernel_builder.kernels import add, flash_attn, gemm, gemv, rmsnorm, rope, swiglu
from llama_npu.models.llama import LLAMA32_1B, LLAMA32_3B, SMOLLM2_135M
from tests import air_checks
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
    if seq == 1:
        for k, m in projections:
            out.append((lambda m=m, k=k: gemv.build(m, k), {"kind": "gemv", "m": m, "k": k}))
    else:
        for k, n in projections:
            out.append((lambda k=k, n=n: gemm.build(seq, k, n), {"kind": "gemm", "m": seq, "k": k, "n": n}))
        out.append((lambda: flash_attn.build(seq, s.n_heads, s.n_kv_heads, s.head_dim),
                    {"kind": "flash_attn", "seq": seq, "heads": s.n_heads, "kv_heads": s.n_kv_heads,
                     "head_dim": s.head_dim, "causal": 1}))
    return out


CASES = [(f"{name}-s{seq}-{i}", s, seq, i) for name, s in MODELS.items() for seq in (1, 64, 2048)
         for i in range(len(model_kernels(s, seq)))]


@pytest.fixture(scope="module")
def mlir_opt():
    return require_tool("mlir-opt-22")


def _generic_parse(mlir_opt: str, text: str) -> None:
    air_checks.mlir_opt_verify(mlir_opt, air_checks.to_generic(text))


@pytest.mark.parametrize("case,s,seq,i", CASES, ids=[c[0] for c in CASES])
def test_builder_structure(case, s, seq, i):
    build, expected = model_kernels(s, seq)[i]
    text = build()
    rep = air_checks.check_module(text)
    assert rep.errors == [], "\n".join(rep.errors)
    assert rep.kernels == [expected]
    assert len(rep.public) == 1 and rep.public[0][0] == expected["kind"]
    # the herd of every kernel fits the 8x4 array
    for h in rep.herds:
        assert h.types, "herd without operands"


@pytest.mark.parametrize("case,s,seq,i", [c for c in CASES if c[2] in (1, 64)], ids=[c[0] for c in CASES
                                                                                      if c[2] in (1, 64)])
def test_builder_mlir_opt(case, s, seq, i, mlir_opt):
    build, _ = model_kernels(s, seq)[i]
    text = build()
    _generic_parse(mlir_opt, text)
    air_checks.mlir_opt_verify(mlir_opt, air_checks.signature_module(text), unregistered=False)
    for _, mod in air_checks.herd_modules(text):
        air_checks.mlir_opt_verify(mlir_opt, mod)


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
    rep = air_checks.check_module(flash_attn.build(64, 32, 8, 64))
    assert rep.public[0][2] == ["memref<64x2048xbf16>", "memref<64x512xbf16>", "memref<64x512xbf16>",
                                "memref<64x2048xbf16>"]
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


GEMM_SHAPES = [(64, 576, 192), (64, 2048, 8192), (2048, 8192, 2048), (2048, 3072, 1024), (16, 576, 1536)]


@pytest.mark.parametrize("m,k,n", GEMM_SHAPES)
def test_gemm_accumulates_in_l1_with_k_loop_in_herd(m, k, n):
    p = planner.plan_gemm(m, k, n)
    bm, bn = p.herd_m * p.tile_m, p.herd_n * p.tile_n
    text = gemm.build(m, k, n)
    rep = air_checks.check_module(text)
    assert rep.errors == []
    launch, seg, herd = rep.air_ops
    seg_body, herd_body = _body(text, seg), _body(text, herd)
    # the herd never sees A or B in L3: its only L3 operand is c
    assert [t for t in herd.types if t.startswith("memref")] == [f"memref<{m}x{n}xbf16>"]
    # L2 holds only the bf16 A row panel and B column panel (no f32 accumulator round-tripping through L2)
    l2 = sorted(set(re.findall(r"memref<([0-9x]+)x(\w+), 1 : i32>", text)))
    assert l2 == sorted({(f"{bm}x{p.tile_k}", "bf16"), (f"{p.tile_k}x{bn}", "bf16")})
    # broadcast channels: A per herd row fans out over the herd's columns, B per column over its rows
    ch = rep.channels
    assert (ch["gemm_a"].size, ch["gemm_a"].broadcast_shape) == \
        ([p.herd_m, 1], None if p.herd_n == 1 else [p.herd_m, p.herd_n])
    assert (ch["gemm_b"].size, ch["gemm_b"].broadcast_shape) == \
        ([1, p.herd_n], None if p.herd_m == 1 else [p.herd_m, p.herd_n])
    # segment: one K loop over [0, k) in tile_k steps: two L3 -> L2 panel DMAs, then one put per herd row
    # (A) and per herd column (B), each slicing its own tile_m rows / tile_n columns of the panel
    seg_outside_herd = seg_body.replace(herd_body, "")
    seg_consts = {n_: int(v) for n_, v in re.findall(r"(%\S+) = arith\.constant (-?\d+) : index", seg_body)}
    seg_loops = re.findall(r"scf\.for %\S+ = %\S+ to (%\S+) step (%\S+) \{", seg_outside_herd)
    assert [(seg_consts[a], seg_consts[b]) for a, b in seg_loops] == [(k, p.tile_k)]
    assert seg_outside_herd.count("air.dma_memcpy_nd") == 2
    puts = [a for a in rep.channel_ops if a.kind == "put"]
    assert all(a.region == "air.segment" for a in puts)
    a_puts = sorted((seg_consts[a.indices[0]], seg_consts[a.indices[1]], seg_consts[a.lists[0][0]])
                    for a in puts if a.symbol == "gemm_a")
    b_puts = sorted((seg_consts[a.indices[0]], seg_consts[a.indices[1]], seg_consts[a.lists[0][1]])
                    for a in puts if a.symbol == "gemm_b")
    assert a_puts == [(i, 0, i * p.tile_m) for i in range(p.herd_m)]
    assert b_puts == [(0, j, j * p.tile_n) for j in range(p.herd_n)]
    # herd: the whole K reduction in one scf.for holding the only linalg.matmul, fed by two channel gets
    # indexed by the tile ids (no DMA from L3 inside the loop)
    loops = re.findall(r"scf\.for %\S+ = %\S+ to (%\S+) step (%\S+) \{", herd_body)
    assert len(loops) == 1
    consts = dict(re.findall(r"(%\S+) = arith\.constant (-?\d+) : index", herd_body))
    assert (int(consts[loops[0][0]]), int(consts[loops[0][1]])) == (k, p.tile_k)
    loop_body = herd_body[herd_body.index("scf.for"):]
    assert herd_body.count("linalg.matmul") == 1 and "linalg.matmul" in loop_body
    gets = [a for a in rep.channel_ops if a.kind == "get"]
    a_ty = f"memref<{p.tile_m}x{p.tile_k}xbf16,2:i32>"
    b_ty = f"memref<{p.tile_k}x{p.tile_n}xbf16,2:i32>"
    assert [(a.symbol, a.indices, a.type, a.region) for a in gets] == \
        [("gemm_a", herd.ids, a_ty, "air.herd"), ("gemm_b", herd.ids, b_ty, "air.herd")]
    # f32 accumulator in L1: zero-filled once before the loop, never DMA'd anywhere
    acc_ty = f"memref<{p.tile_m}x{p.tile_n}xf32, 2 : i32>"
    before_loop = herd_body[:herd_body.index("scf.for")]
    assert f"%acc_l1 = memref.alloc() : {acc_ty}" in before_loop
    assert f"linalg.fill ins(%cst : f32) outs(%acc_l1 : {acc_ty})" in before_loop
    assert not re.search(r"air\.dma_memcpy_nd \([^)]*%acc_l1", text)
    assert "air.dma_memcpy_nd" not in loop_body[:loop_body.index("}")]
    assert f"outs(%acc_l1 : {acc_ty})" in loop_body
    # after the loop one bf16 tile goes out to c
    out = re.findall(r"air\.dma_memcpy_nd \((%ha)\[.*\(memref<" + f"{m}x{n}" + r"xbf16>, memref<(\d+)x(\d+)xbf16, 2", text)
    assert out == [("%ha", str(p.tile_m), str(p.tile_n))]
    assert "arith.truncf %in : f32 to bf16" in herd_body


def test_gemm_panels_cut_ddr_reads():
    """Broadcasting the L2 panels reads A n/BN times and B m/BM times (was n/tile_n and m/tile_m)."""
    m, k, n = 2048, 2048, 8192
    p = planner.plan_gemm(m, k, n)
    bm, bn = p.herd_m * p.tile_m, p.herd_n * p.tile_n
    assert p.ddr_read_bytes(m, k, n) == 2 * (m * k * (n // bn) + k * n * (m // bm))
    per_tile = 2 * (m * k * (n // p.tile_n) + k * n * (m // p.tile_m))
    assert p.ddr_read_bytes(m, k, n) * min(p.herd_m, p.herd_n) <= per_tile


def test_gemm_transform_script_vectorizes_l1_matmul(mlir_opt, tmp_path):
    """The transform script really applies: on the herd body's L1 linalg.matmul it leaves 8x8x8 bf16
    vector.contract ops (no linalg.matmul left)."""
    for shape in ((64, 576, 192), (2048, 2048, 8192)):
        p = planner.plan_gemm(*shape)
        a_ty = f"memref<{p.tile_m}x{p.tile_k}xbf16, 2 : i32>"
        b_ty = f"memref<{p.tile_k}x{p.tile_n}xbf16, 2 : i32>"
        acc_ty = f"memref<{p.tile_m}x{p.tile_n}xf32, 2 : i32>"
        matmul = next(line.strip() for line in gemm.build(*shape).splitlines() if "linalg.matmul" in line)
        assert f"{a_ty}, {b_ty}" in matmul and acc_ty in matmul
        payload = (f"module {{\n  func.func @herd_body() {{\n"
                   f"    %a_l1 = memref.alloc() : {a_ty}\n    %b_l1 = memref.alloc() : {b_ty}\n"
                   f"    %acc_l1 = memref.alloc() : {acc_ty}\n    {matmul}\n    return\n  }}\n}}\n")
        script = tmp_path / "gemm_transform.mlir"
        script.write_text(gemm.transform_script(p))
        res = subprocess.run([mlir_opt, f"--transform-preload-library=transform-library-paths={script}",
                              "--transform-interpreter"], input=payload, capture_output=True, text=True,
                             timeout=120)
        assert res.returncode == 0, res.stderr
        assert "linalg.matmul" not in res.stdout
        contracts = [line for line in res.stdout.splitlines() if "vector.contract" in line]
        assert contracts and all("vector<8x8xbf16>, vector<8x8xbf16> into vector<8x8xf32>" in c
                                 for c in contracts), res.stdout


def test_gemm_transform_script_rejects_off_intrinsic_tiles():
    with pytest.raises(ValueError):
        gemm.transform_script(planner.GemmPlan(12, 64, 64, 1, 1))


def test_gemv_k_variants_have_distinct_symbols():
    a = air_checks.check_module(gemv.build(2048, 2048))
    b = air_checks.check_module(gemv.build(2048, 8192))
    assert set(a.decls).isdisjoint(b.decls)
    for rep in (a, b):
        (decl,) = [d for ds in rep.decls.values() for d in ds]
        assert rep.herds[0].attrs["link_with"] == decl.attrs["link_with"]


def test_causal_flag_changes_module():
    c = flash_attn.build(64, 32, 8, 64, causal=True)
    nc = flash_attn.build(64, 32, 8, 64, causal=False)
    assert air_checks.check_module(nc).kernels[0]["causal"] == 0
    assert air_checks.check_module(c).kernels[0]["causal"] == 1
    assert air_checks.check_module(nc).errors == []


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
    lambda: flash_attn.build(64, 30, 8, 64),
    lambda: flash_attn.build(64, 32, 8, 63),
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
        "args count": _mutate(good, "%ha_2=%sa_2) :", ") :"),
        "bound type": _mutate(good, "args(%sa=%la, %sa_1=%la_1", "args(%sa=%la_1, %sa_1=%la"),
        "isolation": _mutate(good, "%x_l1[] [] [], %ha_1[", "%x_l1[] [] [], %la_1["),
        "memory space": _mutate(good, "memref.alloc() : memref<2048xbf16, 2 : i32>",
                                "memref.alloc() : memref<2048xbf16, 1 : i32>"),
        "link_with": _mutate(good, 'attributes {link_with = "mv_k2048', 'attributes {link_with = "other'),
        "kernel attr": _mutate(good, "llama_npu.kernel", "other.kernel"),
        "undefined": _mutate(good, "arith.addi %t, %i", "arith.addi %nope, %i"),
    }
    for what, text in broken.items():
        assert air_checks.check_module(text).errors, f"checker missed: {what}"
    rep = air_checks.check_module(good, expect_kernels=[{"kind": "gemv", "m": 512, "k": 4096}])
    assert rep.errors


def test_mlir_opt_catches_type_errors(mlir_opt):
    good = gemm.build(64, 576, 192)
    bad = _mutate(good, "outs(%acc_l1 : memref<8x48xf32, 2 : i32>)", "outs(%acc_l1 : memref<8x40xf32, 2 : i32>)")
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
    generic = air_checks.to_generic(good)
    assert '"air.channel"() {sym_name = "gemm_a"' in generic and '"air.channel.get"(%tx, %ty, %a_l1)' in generic
    air_checks.mlir_opt_verify(mlir_opt, generic)
    mutations = {
        "undeclared channel": good.replace("air.channel.put @gemm_b[", "air.channel.put @gemm_c[", 1),
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
    assert "air." not in funcs[0] and "linalg.matmul" in funcs[0]
    res = mlir_check.check_text(text, tool=mlir_opt)
    assert res.ok and res.checked_herds == 1, res.stderr
