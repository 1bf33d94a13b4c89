"""One dispatch per greedy decode token (llama_npu/models/token.py, llama_npu/token_decode.py): on a tiny random
checkpoint the one-module token gives the per-layer decode's tokens (bf16 and q4, a vocabulary whose last LM-head
partition is padding only), with 1 dispatch, <= 64 bytes written and <= 64 read per token; the module binds each
layer's own weight buffers (no second copy) and KV cache; the hardware model accepts it at SmolLM2-135M,
Llama-3.2-1B and Llama-3.1-8B shapes; bad declarations are one line."""
from __future__ import annotations

import numpy as np
import pytest
from checkpoints import write_numpy_checkpoint

from multi_launch_builder.decl import Arg, Role


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return write_numpy_checkpoint(tmp_path_factory.mktemp("tok") / "m", hidden=128, n_heads=4, n_kv_heads=2, ffn=256,
                                  n_layers=2, vocab=250, max_position=512, seed=3)


@pytest.mark.parametrize("mode", ["bf16", "q4"])
def test_one_dispatch_equals_per_layer_decode(tiny, tmp_path_factory, mode):
    from llama_npu.engine import Engine
    eng = Engine.load(str(tiny), device="emu", buckets=(64,), cache_dir=tmp_path_factory.mktemp("k"),
                      progress=False, context=512, weights_mode=mode)
    assert eng.token_decode is not None
    prompt = [int(t) for t in np.random.default_rng(1).integers(3, 250, size=250)]
    eng.cache.reset_counters()
    one = eng.generate(prompt, 12).tokens      # decode crosses the 256-position window into 512
    rows = {r["module"]: r for r in eng.cache.report()}
    tok = {n: r for n, r in rows.items() if n.startswith("token_kv")}
    assert set(tok) == {"token_kv256", "token_kv512"}
    n = len(one) - 1
    assert sum(r["calls"] for r in tok.values()) == n
    assert not any(name.startswith("layer_kv") for name in rows)            # no per-layer decode dispatch
    assert sum(r["bytes_written"] for r in tok.values()) <= 64 * n
    assert sum(r["bytes_read"] for r in tok.values()) == 8 * n             # one (id, logit) pair
    # each layer's weights are the per-layer modules' buffers: the token modules add no static bytes
    assert sum(r["static_bytes_written"] for r in tok.values()) == 0
    eng.token_decode = None
    eng.reset()
    assert eng.generate(prompt, 12).tokens == one


def test_untied_q4_embedding_rows_on_the_device_in_4_bits(tmp_path_factory):
    """An untied model with 4-bit weights keeps its embedding rows on the device as q4 rows (the EMBED state:
    row_bytes per row, a quarter of bf16's plus the scales), dequantized on the core; the one-module token gives the
    per-layer decode's tokens, whose host gather reads the same rows' dequantization."""
    from kernel_builder.gemv_q4.format import Q4Layout
    from llama_npu.engine import Engine
    from llama_npu.models.token import EMBED
    src = write_numpy_checkpoint(tmp_path_factory.mktemp("untied") / "m", hidden=128, n_heads=4, n_kv_heads=2,
                                 ffn=256, n_layers=2, vocab=250, max_position=256, seed=5, tied=False)
    eng = Engine.load(str(src), device="emu", buckets=(64,), cache_dir=tmp_path_factory.mktemp("ku"),
                      progress=False, context=256, weights_mode="q4", warmup=False)
    d = eng.token_decode.decls[256]
    (row,) = [a for a in d.args if a.state_name == EMBED]
    assert (row.dtype, row.shape) == ("i8", (1, Q4Layout(128, 32, True).row_bytes))
    assert [la.build.args[0] for la in d.launches][0] == "dequant_q4"
    prompt = [5, 17, 42, 7, 99, 3]
    one = eng.generate(prompt, 8).tokens
    assert eng.cache.report() and any(r["module"] == "token_kv256" and r["calls"] == len(one) - 1
                                      for r in eng.cache.report())
    eng.token_decode = None
    eng.reset()
    assert eng.generate(prompt, 8).tokens == one


def test_top_k_sampling_from_device_candidates(tiny, tmp_path_factory):
    """Top-k sampling reads the k best (id, logit) pairs (8·k bytes) and draws exactly what the sampler draws from
    the whole logits with the same seed."""
    from llama_npu.engine import Engine
    from llama_npu.sampling import Sampler
    eng = Engine.load(str(tiny), device="emu", buckets=(64,), cache_dir=tmp_path_factory.mktemp("k4"),
                      progress=False, context=256, warmup=False)
    prompt = [5, 17, 42, 7, 99]
    eng.cache.reset_counters()
    one = eng.generate(prompt, 10, sampler=Sampler(temperature=1.5, top_k=8, seed=7)).tokens
    rows = {r["module"]: r for r in eng.cache.report()}
    k8 = rows["token_kv256_k8"]
    assert k8["calls"] == len(one) - 1 and k8["bytes_read"] == 64 * (len(one) - 1)
    eng.token_decode = None
    eng.reset()
    assert eng.generate(prompt, 10, sampler=Sampler(temperature=1.5, top_k=8, seed=7)).tokens == one


def test_decode_next_matches_the_logits_argmax(tiny, tmp_path_factory):
    from llama_npu.engine import Engine
    eng = Engine.load(str(tiny), device="emu", buckets=(64,), cache_dir=tmp_path_factory.mktemp("k2"),
                      progress=False, context=256, warmup=False)
    logits = eng.prefill([3, 4, 5]).logits
    a = eng.decode_next(int(np.argmax(logits)))
    eng.prefill([3, 4, 5])
    b = int(np.argmax(eng.decode_step(int(np.argmax(logits)))))
    assert a == b and eng.pos == 4


def test_null_device_bytes_per_greedy_token(tiny, tmp_path_factory):
    from llama_npu.engine import Engine
    eng = Engine.load(str(tiny), device="null", buckets=(64,), cache_dir=tmp_path_factory.mktemp("k3"),
                      progress=False, context=256, warmup=False)
    eng.prefill([3, 4, 5])
    eng.cache.reset_counters()
    for i in range(4):
        eng.decode_next(10 + i)
    rows = eng.cache.report()
    assert sum(r["calls"] for r in rows) == 4
    assert sum(r["bytes_written"] for r in rows) <= 4 * 64 and sum(r["bytes_read"] for r in rows) <= 4 * 64


@pytest.mark.parametrize("name,weights,tied", [("smollm2-135m", "bf16", True), ("llama32-1b", "q4", True),
                                               ("llama31-8b", "q4", False)])
def test_hardware_model_accepts_the_token_module(name, weights, tied):
    from kernel_builder.hw import analyze_module
    from llama_npu.models.llama import LLAMA31_8B, SMOLLM2_135M, LLAMA32_1B, LlamaModel
    from llama_npu.models.token import token_module
    from multi_launch_builder.stitcher import stitch
    shapes = {"smollm2-135m": SMOLLM2_135M, "llama32-1b": LLAMA32_1B, "llama31-8b": LLAMA31_8B}[name]
    m = LlamaModel(shapes, weights)
    m.tied = tied
    d = token_module(m, 1024)
    rep = analyze_module(stitch(d), d.name)
    assert rep.ok, rep.first_violation()
    # [the 4-bit embedding row's dequant] + every layer + final norm + per partition a GEMV and a topk
    embed = int(weights == "q4")      # tied: the LM head's q4 row; untied: the q4 EMBED row
    assert len(d.launches) == embed + shapes.n_layers * len(m.decode(1024).decls[0].launches) + 1 + 2 * m.lm_parts
    assert ("embed" in d.states()) == (not tied) and "vocab" in d.states()


def test_bad_declarations_are_one_line():
    with pytest.raises(ValueError, match="bo_key= is for STATE and STATIC"):
        Arg("x", (1, 4), Role.INPUT, bo_key="L0")
    with pytest.raises(ValueError, match="shares= is"):
        Arg("w", (4, 4), Role.STATIC, shares=("layer",))


def test_models_with_host_hooks_keep_the_per_layer_decode():
    from llama_npu.models.token import token_module, unsupported
    from llama_npu.token_decode import token_decls
    from llama_npu.models.llama import LLAMA32_1B, LlamaModel

    class ScaledModel(LlamaModel):
        def embed_rows(self, x):
            return x * 2
    m = ScaledModel(LLAMA32_1B)
    assert "scales the embedding rows" in unsupported(m)
    assert token_decls(m, (256,)) == []
    with pytest.raises(ValueError, match="one-module decode"):
        token_module(m, 256)
