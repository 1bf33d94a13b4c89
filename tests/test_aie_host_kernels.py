"""Every external kernel's AIE2P vector path, compiled with g++ against the host aie_api
(external_kernels/aie_api_host, kernel_builder.aie_host), at every object the builders link for SmolLM2-135M,
Llama-3.2-1B and Llama-3.2-3B (`llama-npu compile` at the default buckets and an 8192-token context, plus the
host-attention decode fallback), driven with the builders' offsets (GEMV rows/K chunks, attention Q/K/V items
and positions, decode shares and merge) against kernel_builder.reference. Tolerances and drivers:
tests/aie_host_runs.py. Instruction counts: checked against the loop structure of each kernel.
"""
from __future__ import annotations

import re

import numpy as np
import pytest

from kernel_builder import aie_host_runs as runs
from kernel_builder import aie_host
from tooling import require_tool

BUCKETS, CONTEXT = (64, 256, 1024, 2048), 8192
# The external objects linked by the stitched modules (regenerate: test_listed_objects_are_the_builders').
BUILDER_OBJECTS = {
    "smollm2-135m": [
        'add_n2304.o', 'add_n3072.o', 'add_n4096.o', 'attnd_hd64_q3_k64_n4.o', 'attnp_hd64_q16_k16_n4.o',
        'attnp_hd64_q32_k32_n8.o', 'attnp_hd64_q64_k32_n8.o', 'gemm_m128_k32_n48.o', 'gemm_m32_k64_n48.o',
        'gemm_m32_k64_n64.o', 'gemm_m8_k64_n128.o', 'gemm_m8_k64_n48.o', 'mv_k576_c576_m12_r12.o',
        'mv_k576_c576_m16_r192.o', 'mv_k576_c576_m16_r384.o', 'mv_k576_c576_m9_r36.o', 'mvb_k1536_c1536_m9_r36.o',
        'mvb_k576_c576_m9_r36.o', 'rmsnorm_g576_u1.o', 'rmsnorm_g576_u4.o', 'rope_hd64_h3_r1.o', 'rope_hd64_h3_r16.o',
        'rope_hd64_h3_r8.o', 'rope_hd64_h9_r1.o', 'rope_hd64_h9_r4.o', 'swiglu_n256.o',
    ],
    "llama32-1b": [
        'add_n4096.o', 'attnd_hd64_q4_k64_n4.o', 'attnp_hd64_q16_k16_n4.o', 'attnp_hd64_q32_k32_n8.o',
        'attnp_hd64_q64_k32_n8.o', 'gemm_m32_k64_n128.o', 'gemm_m32_k64_n64.o', 'gemm_m64_k32_n128.o',
        'gemm_m64_k64_n64.o', 'gemm_m8_k64_n128.o', 'mv_k2048_c2048_m4_r1024.o', 'mv_k2048_c2048_m4_r128.o',
        'mv_k2048_c2048_m4_r32.o', 'mvb_k2048_c2048_m4_r128.o', 'mvb_k8192_c8192_m1_r128.o', 'rmsnorm_g2048_u1.o',
        'rmsnorm_g2048_u2.o', 'rope_hd64_h32_r2.o', 'rope_hd64_h4_r1.o', 'rope_hd64_h8_r8.o', 'swiglu_n1024.o',
    ],
    "llama32-3b": [
        'add_n4096.o', 'attnd_hd128_q3_k32_n4.o', 'attnd_hd128_q3_k64_n4.o', 'attnp_hd128_q16_k16_n4.o',
        'attnp_hd128_q32_k32_n8.o', 'gemm_m32_k64_n128.o', 'gemm_m32_k64_n64.o', 'gemm_m64_k32_n128.o',
        'gemm_m64_k64_n64.o', 'gemm_m8_k64_n128.o', 'mv_k3072_c3072_m4_r1024.o', 'mv_k3072_c3072_m4_r192.o',
        'mv_k3072_c3072_m4_r64.o', 'mvb_k3072_c3072_m4_r192.o', 'mvb_k8192_c8192_m1_r192.o', 'rmsnorm_g3072_u1.o',
        'rope_hd128_h24_r1.o', 'rope_hd128_h2_r1.o', 'rope_hd128_h3_r1.o', 'rope_hd128_h8_r4.o', 'swiglu_n1024.o',
    ],
}
OBJECTS = sorted(set().union(*BUILDER_OBJECTS.values()))


@pytest.fixture(scope="module", autouse=True)
def built():
    require_tool("g++")
    aie_host.build_all([runs.kernel_of(o) for o in OBJECTS])


@pytest.mark.parametrize("obj", OBJECTS)
def test_vector_path_matches_reference(obj):
    r = runs.run(obj, np.random.default_rng(sum(map(ord, obj))))
    assert np.isfinite(r.got.astype(np.float32)).all(), f"{obj}: non-finite output"
    assert not runs.mismatch(r), f"{obj}: {runs.mismatch(r)}"


@pytest.mark.parametrize("obj", ["attnd_hd96_q3_k64_n4.o", "attnd_hd256_q4_k16_n2_w24_s128.o",
                                 "attnp_hd96_q32_k32_n8.o"])
def test_family_head_dims_vector_path(obj):
    """Head dims no reference model links: Phi-4-mini's 96 (three 32-lane chunks: decode's p.V passes take two and
    then one) and Gemma 3's 256 with its window and query pre-attention scalar."""
    aie_host.build_all([runs.kernel_of(obj)])
    r = runs.run(obj, np.random.default_rng(sum(map(ord, obj))))
    assert np.isfinite(r.got.astype(np.float32)).all(), f"{obj}: non-finite output"
    assert not runs.mismatch(r), f"{obj}: {runs.mismatch(r)}"


def test_listed_objects_are_the_builders():
    from multi_launch_builder.stitcher import stitch
    from llama_npu.models import llama as shapes
    from llama_npu.models.llama import LlamaModel

    link = re.compile(r'link_with\s*=\s*"([^"]+)"')
    for name, objs in BUILDER_OBJECTS.items():
        m = LlamaModel(shapes.REFERENCE_SHAPES[name])
        decls = m.modules(BUCKETS, CONTEXT)
        decls += [d for d in m.modules(BUCKETS, CONTEXT, "host") if d.name.endswith("_dec")]
        found = set().union(*(set(link.findall(stitch(d))) for d in decls))
        assert sorted(found) == objs, f"{name}: builders link {sorted(found)}"


def _one(obj):
    return runs.run(obj, np.random.default_rng(1)).counts


def test_counts_follow_the_loops():
    """One call's counts are what the kernel's loops execute (formulas from the sources' loop bounds)."""
    c = _one("gemm_m64_k64_n64.o")                   # mac: (64/8)^3 block-float 8x8x8 steps
    assert c["mmul_bfp16_8x8x8"] == 8 * 8 * 8 and c["mmul_bf16_4x8x8_emulated"] == 0
    # no transposes (w blocks are mac_8x8_8x8T's [n][k] operand as stored); each a block converted once per call
    # (64, into the block-float scratch), each w block once per call (64, in place); one load + one store per f32
    # output block per call
    assert c["shuffle"] == 0 and c["bfp16_convert"] == 64 + 64 and c["vmac_bf16"] == 0
    assert c["vstore"] == 8 * 8 * 4 + 2 * (64 + 64)   # 64 f32 = 4 x 512 bit per block; 128 block-float blocks
    c = _one("mv_k2048_c2048_m4_r128.o")             # one 4-row step: 4 x 2048/32 bf16 MACs, 2 loads each
    assert c["vmac_bf16"] == 4 * 64 and c["vload"] == 2 * 4 * 64 and c["reduce_add"] == 4
    assert c["vmul_f32_emulated"] == 0
    c = _one("attnp_hd64_q32_k32_n8.o")              # a fully visible K/V tile: Q.K^T and P.V, 8x8x8 blocks
    blocks = 2 * (32 // 8) * (32 // 8) * (64 // 8)
    assert c["mmul_bfp16_8x8x8"] == blocks and c["mmul_bf16_4x8x8_emulated"] == 0
    # the only shuffles: one transpose per V block per item (K/V arrive 8x8-blocked; K needs none) and the 7 of
    # each of the two 8-row reduction trees (maxima, sums) per row block; no reduce_max / reduce_add per row
    assert c["shuffle"] == (32 // 8) * (64 // 8) + 2 * 7 * (32 // 8) and c["vmac_bf16"] == (32 // 16) * 32
    assert c.get("reduce_max", 0) == 0 and c.get("reduce_add", 0) == 0
    # each operand block converted to block float once: K and V^T per item (2 x 4 x 8), the probabilities per row
    # block (4 x 4; Q when captured, not in this call), not per use (it was 3 per 2 mmuls: 384 here); no f32 multiply
    # in the softmax (Q arrives scaled by scale * log2e): the only f32 multiplies are the accumulators' rescale (4
    # per 8x8 block) and l = alpha * l + sum (1 per row block)
    assert c["bfp16_convert"] == 2 * (32 // 8) * (64 // 8) + (32 // 8) * (32 // 8)
    assert c["vmul_f32_emulated"] == 4 * (32 // 8) * (64 // 8) + 32 // 8 and c["exp2"] > 0
    c = _one("rmsnorm_g2048_u1.o")
    assert c["invsqrt_scalar"] == 1 and c["vmac_bf16"] == 2048 // 32 * 5


def _mean_rel(r):
    g, w = r.got.astype(np.float64), r.want.astype(np.float64)
    return np.abs(g - w).mean() / np.abs(w).mean()


def test_attention_block_float_numerics():
    """The prefill vector path against the numpy model of its block-float arithmetic (the driver's default:
    reference.attention_block_float, bound 2^-7 |ref| + 2^-9 max|ref|) and against the exact f32 reference: the
    error the block-float format costs (docs/hardware-model.md, "Attention numerics": ~2 % mean relative at
    these random scores, std 3 in log2 units; the verify gate passes with it, tests/test_attention_block_float.py)."""
    obj = "attnp_hd64_q64_k32_n8.o"
    lib = aie_host.load(runs.kernel_of(obj))
    bfp = [runs._prefill(lib, np.random.default_rng(s), 64, 64, 32, 8) for s in range(3)]
    exact = [runs._prefill(lib, np.random.default_rng(s), 64, 64, 32, 8, bfp_want=False) for s in range(3)]
    assert not any(runs.mismatch(r) for r in bfp)
    e_bfp, e_exact = np.mean([_mean_rel(r) for r in bfp]), np.mean([_mean_rel(r) for r in exact])
    assert e_bfp < 1e-3 and 1e-2 < e_exact < 3e-2, (e_bfp, e_exact)


def test_attention_prefill_needs_the_block_float_flag():
    """The prefill vector path is block-float only: without aie_api's flag the object does not compile."""
    from external_kernels.paths import SOURCE_DIR

    kernel = runs.kernel_of("attnp_hd64_q16_k16_n4.o")
    src = SOURCE_DIR / "attention.cc"
    assert aie_host.compile_errors(kernel, src) == ""
    assert "block-float" in aie_host.compile_errors(kernel, src, ("-UAIE_API_EMULATE_BFLOAT16_MMUL_WITH_BFP16",))


@pytest.mark.parametrize("obj", ["attnp_hd64_q32_k32_n8.o", "attnp_hd128_q16_k16_n4.o", "attnd_hd64_q3_k64_n4.o",
                                 "attnp_hd64_q32_k32_n2_w40.o", "attnd_hd64_q3_k64_n4_w100.o"])
def test_attention_causal_edges(obj):
    """Positions where the causal bound cuts the first tile, lands on a tile edge, or leaves whole decode shares
    (partials) empty; with a sliding window (_w), also where the window's start does."""
    name, (mode, hd, lq, lk, n, w, sd) = runs.family(obj)
    lib = aie_host.load(runs.kernel_of(obj))
    extra = {"window": w, "scale_dim": sd}
    for pos in (0, 1, lk - 1, lk, lk + 1, 5 * lk - 3):
        rng = np.random.default_rng(pos)
        r = runs._prefill(lib, rng, hd, lq, lk, n, pos=pos, **extra) if mode == "p" else runs._decode(
            lib, rng, hd, lq, lk, n, pos=pos % (2 * lk * n), **extra)
        assert not runs.mismatch(r), f"{obj} pos {pos}: {runs.mismatch(r)}"


def test_bfp16ebs8_model():
    """The block-float model shared by the host mmul and the numpy reference (docs/aie-api-host.md)."""
    from kernel_builder.numerics import to_bfp16ebs8

    x = np.array([[1.0, 0.5, 0.25, 3.0, -4.0, 0.01, 1.9921875, -1.0078125],     # E = 2: step 2^-4
                  [1.9921875, 1.0, 1.5 * 2**-6, 2.5 * 2**-6, 0, 0, 0, 0],         # E = 0: step 2^-6, max 127 steps
                  [0.0] * 8, [1.0, np.inf] + [0.0] * 6], np.float32)
    q = to_bfp16ebs8(x)
    np.testing.assert_array_equal(q[0], [1.0, 0.5, 0.25, 3.0, -4.0, 0.0, 2.0, -1.0])
    np.testing.assert_array_equal(q[1], [1.984375, 1.0, 2**-5, 2**-5, 0, 0, 0, 0])  # saturates; ties to even
    np.testing.assert_array_equal(q[2], 0.0)
    assert np.isnan(q[3]).all()
    with pytest.raises(ValueError, match="multiple of 8"):
        to_bfp16ebs8(np.zeros(12, np.float32))
