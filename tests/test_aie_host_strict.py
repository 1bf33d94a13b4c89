"""How strict the host aie_api is, and that the vector-path tests can fail: shapes/types aie_api does not provide for
AIE2P do not compile, a misaligned vector access is an error, an off-by-one loop bound in gemm.cc, gemv.cc or
attention.cc (a mutated copy of the source, compiled here) breaks the reference comparison, a kernel that forgets
its rounding mode is caught, and an edit that changes the executed instructions changes the counts."""
from __future__ import annotations

import re

import numpy as np
import pytest

from kernel_builder import aie_host_runs as runs
from kernel_builder import aie_host
from kernel_builder import externals as ext
from tooling import require_tool
from external_kernels.compile_rules import ExternalKernel
from external_kernels.paths import SOURCE_DIR
from kernel_builder.gemm.external import gemm_kernels
from kernel_builder.rope.external import rope_kernel


@pytest.fixture(scope="module", autouse=True)
def cxx():
    require_tool("g++")


FLAG = "AIE_API_EMULATE_BFLOAT16_MMUL_WITH_BFP16"


def _errors(tmp_path, body: str, flag: int) -> str:
    src = tmp_path / "probe.cc"
    src.write_text("#include <aie_api/aie.hpp>\nvoid probe() {\n" + body + "\n}\n")
    return aie_host.compile_errors(None, src, (f"-D{FLAG}={flag}",))


MMUL = "aie::mmul<{}, bfloat16, bfloat16> m; m.mac(aie::zeros<bfloat16, {}>(), aie::zeros<bfloat16, {}>());"


@pytest.mark.parametrize("flag", [0, 1])
def test_mmul_shapes(tmp_path, flag):
    """4x8x8 and 8x8x8 bf16 compile with and without the block-float flag; shapes aie_api has no AIE2P mode for
    (detail/mmul.hpp:91) do not, nor a non-f32 accumulator."""
    assert _errors(tmp_path, MMUL.format("4, 8, 8", 32, 64), flag) == ""
    assert _errors(tmp_path, MMUL.format("8, 8, 8", 64, 64), flag) == ""
    for shape, a, b in (("4, 16, 8", 64, 128), ("8, 8, 16", 64, 128), ("2, 8, 8", 16, 64)):
        err = _errors(tmp_path, MMUL.format(shape, a, b), flag)
        assert "not an AIE2P shape" in err, f"mmul<{shape}> with {FLAG}={flag} compiled: {err[:400]}"
    err = _errors(tmp_path, "aie::mmul<4, 8, 8, bfloat16, bfloat16, bfloat16> m;", flag)
    assert "accfloat" in err


def test_flag_values_and_types_outside_aie_api_do_not_compile(tmp_path):
    assert "must be 0 or 1" in _errors(tmp_path, "aie::mmul<4, 8, 8, bfloat16, bfloat16> m;", 2)
    mixed = "auto a = aie::mul(aie::zeros<bfloat16, 32>(), aie::zeros<float, 32>());"
    assert "not mixed types" in _errors(tmp_path, mixed, 0)
    assert "at least 128 bits" in _errors(tmp_path, "aie::vector<bfloat16, 4> v;", 0)
    assert "AIE2P returns bfloat16" in _errors(tmp_path, "auto e = aie::exp2<float>(aie::zeros<float, 16>());", 0)


def test_misaligned_vector_load_and_store_fail(rng=np.random.default_rng(0)):
    k = rope_kernel(64, 3, 1)
    lib = aie_host.load(k)
    x, lut = runs.rand(rng, (1, 192)), runs.rand(rng, (1, 64))
    y = aie_host.aligned(np.zeros((1, 192), x.dtype))
    lib.call(k.symbol, aie_host.aligned(x), aie_host.aligned(lut), y)      # aligned: fine
    with pytest.raises(aie_host.AieHostError, match=r"misaligned load_v of 32 x bfloat16 .*64-byte alignment"):
        lib.call(k.symbol, aie_host.aligned(x, offset=2), aie_host.aligned(lut), y)
    g = gemm_kernels(8, 64, 48)
    with pytest.raises(aie_host.AieHostError, match=r"misaligned store_v of 32 x float"):
        aie_host.load(g.zero).call(g.zero.symbol, aie_host.aligned(np.zeros(8 * 48, np.float32), offset=32))


# (object at a builder shape, source, loop-bound regex, replacement): one element/block short in the vector path
MUTATIONS = [
    ("gemm_m64_k64_n64.o", "gemm.cc", r"kb < kWC; \+\+kb\) \{\n            const",
     "kb < kWC - 1; ++kb) {\n            const"),
    ("gemm_m8_k64_n128.o", "gemm.cc", r"nb < kNB; nb \+= 2\)", "nb < kNB - 2; nb += 2)"),
    # the block-float A scratch: one a block short of converted (the last row-block pair reads a stale block)
    ("gemm_m64_k32_n128.o", "gemm.cc", r"to_bfp_blocks\(a, bfp_a, kMB \* kKB\)",
     "to_bfp_blocks(a, bfp_a, kMB * kKB - 1)"),
    # the in-place block-float W: one w block short of converted (the last column block reads raw bf16 bytes)
    ("gemm_m64_k32_n128.o", "gemm.cc", r"to_bfp_blocks\(w, bfp_w, kNB \* kKB\)",
     "to_bfp_blocks(w, bfp_w, kNB * kKB - 1)"),
    ("gemm_m32_k64_n128.o", "gemm.cc", r"y1s.seek\(\(c \* kNB \+ nb \+ 1\) \* kWC\)",
     "y1s.seek((c * kNB + nb + 1) * kWC - 1)"),
    # the in-place epilogues: one (gate, up) pair short, the up block one block off its gate (the pair's own
    # gate read as up), the pair index one block off (2nb + 1: a gate read from the pair's up), one bias
    # block short
    ("gemm_m64_k32_n128.o", "gemm.cc", r"nb < kHalfNB; \+\+nb\)\n      for \(int h",
     "nb < kHalfNB - 1; ++nb)\n      for (int h"),
    ("gemm_m64_k32_n128.o", "gemm.cc", r"acc_bf16\(acc, gi \+ kBlockElems\)", "acc_bf16(acc, gi)"),
    ("gemm_m8_k64_n128.o", "gemm.cc", r"\(mb \* kNB \+ 2 \* nb\) \* kBlockElems \+ h;",
     "(mb * kNB + 2 * nb + 1) * kBlockElems + h;"),
    ("gemm_m32_k64_n128.o", "gemm.cc", r"nb < kNB; \+\+nb\) \{\n      const ::aie::vector<bfloat16, kBlock> b8",
     "nb < kNB - 1; ++nb) {\n      const ::aie::vector<bfloat16, kBlock> b8"),
    ("mv_k2048_c2048_m4_r128.o", "gemv.cc", r"c \+ 2 \* kLanes <= GEMV_KC", "c + 2 * kLanes < GEMV_KC"),
    ("mv_k576_c576_m12_r12.o", "gemv.cc", r"m < GEMV_TILE_M; \+\+m\) \{\n    const bfloat16 \*LLAMA_NPU_RESTRICT",
     "m < GEMV_TILE_M - 1; ++m) {\n    const bfloat16 *LLAMA_NPU_RESTRICT"),
    ("bias_add_n1536.o", "add.cc", r"i < ADD_N; i \+= kLanes\)", "i < ADD_N - kLanes; i += kLanes)"),
    # attention's block-float prefill (attention_prefill.h, ATTN_MODE 1): every loop of its vector path one short
    ("attnp_hd64_q32_k32_n8.o", "attention_prefill.h", r"jb < kKB; jb \+= 2\) \{\n    BfpIn as",
     "jb < kKB - 2; jb += 2) {\n    BfpIn as"),
    ("attnp_hd128_q16_k16_n4.o", "attention_prefill.h", r"d < kDB; \+\+d\) \{\n      const Bfp a",
     "d < kDB - 1; ++d) {\n      const Bfp a"),
    ("attnp_hd64_q64_k32_n8.o", "attention_prefill.h", r"jb < kKB; \+\+jb\) \{\n      BfpIn vs",
     "jb < kKB - 1; ++jb) {\n      BfpIn vs"),
    # the 8-row reduction tree pairing two rows the wrong way round (rows 6 and 7 get each other's max and sum)
    ("attnp_hd64_q32_k32_n8.o", "attention_tree.h", r"kTreeB\[4\] = \{2, 3, 6, 7\}", "kTreeB[4] = {2, 3, 7, 6}"),
    ("attnd_hd64_q4_k64_n4.o", "attention_tree.h", r"kTreeB\[4\] = \{2, 3, 6, 7\}", "kTreeB[4] = {2, 3, 7, 6}"),
    # the in-place block-float conversion (K per item, the probabilities per row block) one block short
    ("attnp_hd64_q32_k32_n8.o", "attention_prefill.h", r"b < n; \+\+b\)", "b < n - 1; ++b)"),
    ("attnp_hd64_q32_k32_n8.o", "attention_prefill.h", r"db < kDB; db \+= 2\)", "db < kDB - 2; db += 2)"),
    ("attnp_hd64_q64_k32_n8.o", "attention_prefill.h", r"i < kQB; \+\+i\) \{\n    const int32_t qp",
     "i < kQB - 1; ++i) {\n    const int32_t qp"),
    ("attnp_hd64_q16_k16_n4.o", "attention_prefill.h", r"b < kKB \* kDB; \+\+b\)", "b < kKB * kDB - 1; ++b)"),
    ("attnp_hd64_q32_k32_n8.o", "attention_prefill.h", r"e < kDB \* kBlk; e \+= kBlk\)", "e < kDB * kBlk - kBlk; e += kBlk)"),
    ("attnp_hd64_q32_k32_n8.o", "attention_prefill.h", r"d >= kQB \* kCycle \|\|", "d >= kQB * kCycle - kCycle ||"),
    ("attnp_hd128_q16_k16_n4.o", "attention_prefill.h", r"r < 8; \+\+r\) ::aie::store_v\(out",
     "r < 7; ++r) ::aie::store_v(out"),
    ("attnp_hd64_q32_k32_n8.o", "attention_prefill.h", r"for \(int j = visible_keys\(q_last, k_pos0\);",
     "for (int j = visible_keys(q_last, k_pos0) + 1;"),
    ("attnd_hd64_q4_k64_n4.o", "attention_tree.h", r"d < kHd; d \+= kDotLanes\)\n    dot",
     "d < kHd - kDotLanes; d += kDotLanes)\n    dot"),
    ("attnd_hd64_q4_k64_n4.o", "attention.cc", r"c < kC; c \+= 2\) pv_pass", "c < kC - 2; c += 2) pv_pass"),
    ("attnd_hd64_q4_k64_n4.o", "attention.cc", r"j < vis; j \+= 8\)", "j < vis - 8; j += 8)"),
    # the sliding window one key too wide (prefill and decode; Gemma 3's local layers, head_dim 256)
    ("attnp_hd64_q32_k32_n8_w40.o", "attention.cc", r"q_pos - kWindow \+ 1 - k_pos0", "q_pos - kWindow - k_pos0"),
    ("attnd_hd256_q4_k16_n2_w24_s128.o", "attention.cc", r"q_pos - kWindow \+ 1 - k_pos0",
     "q_pos - kWindow - k_pos0"),
    ("geglu_n256.o", "geglu.cc", r"i < GEGLU_N; i \+= kLanes\) \{\n    const Vb g",
     "i < GEGLU_N - kLanes; i += kLanes) {\n    const Vb g"),
]


def _mutant(tmp_path, obj, source, pattern, repl) -> aie_host.AieHostLibrary:
    text = (SOURCE_DIR / source).read_text()
    mutated, n = re.subn(pattern, repl, text)
    assert n >= 1, f"{source}: the loop bound {pattern!r} is gone; update the mutation"
    path = tmp_path / source
    path.write_text(mutated)
    kernel = runs.kernel_of(obj)
    if source != kernel.source:   # a header the kernel's source includes: "..." finds the mutated copy beside it
        path = tmp_path / kernel.source
        path.write_text((SOURCE_DIR / kernel.source).read_text())
    return aie_host.load(kernel, source=path)


@pytest.mark.parametrize("obj,source,pattern,repl", MUTATIONS, ids=[f"{m[1]}:{m[0]}" for m in MUTATIONS])
def test_off_by_one_loop_bound_fails(tmp_path, obj, source, pattern, repl):
    rng = np.random.default_rng(3)
    assert not runs.mismatch(runs.run(obj, rng))                       # the real source passes ...
    r = runs.run(obj, np.random.default_rng(3), _mutant(tmp_path, obj, source, pattern, repl))
    assert runs.mismatch(r), f"{obj}: the mutated loop bound went unnoticed"   # ... the mutant does not


def test_missing_rounding_mode_is_caught(tmp_path):
    """aie_api's default rounding is floor: a kernel that does not select conv_even rounds every bf16 result down."""
    lib = _mutant(tmp_path, "add_n4096.o", "add.cc", r"::aie::set_rounding\([^)]*\);", "")
    assert "elements out of bound" in runs.mismatch(runs.run("add_n4096.o", np.random.default_rng(0), lib))


def test_counts_change_with_the_code(tmp_path):
    """gemm.cc without its two-row-block unroll computes the same bits with the same block-float MACs but reloads
    every block-float w block once per row block (each is converted once per call either way): the counts say so."""
    obj = "gemm_m64_k64_n64.o"
    base = runs.run(obj, np.random.default_rng(4))
    lib = _mutant(tmp_path, obj, "gemm.cc", r"kUM = \(kMB % 2 == 0\) \? 2 : 1;", "kUM = 1;")
    edit = runs.run(obj, np.random.default_rng(4), lib)
    np.testing.assert_array_equal(edit.got.astype(np.float32), base.got.astype(np.float32))
    assert edit.counts["mmul_bfp16_8x8x8"] == base.counts["mmul_bfp16_8x8x8"] == 512
    assert edit.counts["vload"] > base.counts["vload"]
    assert edit.counts["vload_bytes"] > base.counts["vload_bytes"]       # each w block reloaded once per row block
    assert edit.counts["bfp16_convert"] == base.counts["bfp16_convert"] == 64 + 64   # a and w blocks, once each
    assert edit.counts["shuffle"] == base.counts["shuffle"] == 0         # and never transposed


def test_host_block_float_equals_the_numpy_model(tmp_path):
    """mmul<8,8,8> under the flag with B = I gives A's rows through the C++ block-float conversion: the same
    values as kernel_builder.numerics.to_bfp16ebs8 (the GEMM's numpy reference)."""
    from kernel_builder.numerics import BF16, to_bfp16ebs8

    src = tmp_path / "probe.cc"
    src.write_text("#include <aie_api/aie.hpp>\n"
                   'extern "C" void probe(const bfloat16 *a, const bfloat16 *eye, float *c) {\n'
                   "  aie::set_rounding(aie::rounding_mode::conv_even);\n"
                   "  aie::mmul<8, 8, 8, bfloat16, bfloat16> m;\n"
                   "  m.mul(aie::load_v<64>(a), aie::load_v<64>(eye));\n"
                   "  aie::store_v(c, m.template to_vector<float>());\n}\n")
    kernel = ExternalKernel(symbol="probe", obj="bfp_probe.o", source="probe.cc", defines=())
    lib = aie_host.load(kernel, source=src, defines=(f"-D{FLAG}=1",))
    rng = np.random.default_rng(5)
    a = runs.rand(rng, (8, 8)) * np.float32(2.0) ** rng.integers(-6, 6, (8, 1))   # rows of different scales
    a = a.astype(BF16)
    c = aie_host.aligned(np.zeros((8, 8), np.float32))
    counts = lib.call("probe", aie_host.aligned(a), aie_host.aligned(np.eye(8, dtype=np.float32).astype(BF16)), c)
    np.testing.assert_array_equal(c, to_bfp16ebs8(a.astype(np.float32)))
    assert not np.array_equal(c, a.astype(np.float32))                             # it did quantize
    assert counts["mmul_bfp16_8x8x8"] == 1 and counts["bfp16_convert"] == 2
