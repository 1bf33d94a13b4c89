"""`--kv int8` end to end on emu: a tiny random checkpoint. The KV8 cache rows the engine writes are exactly the
bf16 engine's K and V cache rows quantized (the same projections; kv_quant's reference), its logits stay close to
the bf16 engine's (prefill and decode, stated bound) without being identical, the one-dispatch greedy decode gives
the per-layer decode's tokens, a prompt in later chunks (attending over the dequantized history) gives the logits
of one chunk, the memory plan holds int8 rows, and the modules pass the hardware model at
Llama-3.2-1B widths; unsupported combinations are one clear error."""
from __future__ import annotations

import numpy as np
import pytest
from checkpoints import write_numpy_checkpoint

from kernel_builder.kv_quant.reference import pack_rows, row_bytes


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    from llama_npu.engine import Engine
    tmp = tmp_path_factory.mktemp("kv8")
    src = write_numpy_checkpoint(tmp / "m", hidden=128, n_heads=4, n_kv_heads=2, ffn=256, n_layers=2, vocab=256,
                                 max_position=256)
    out = {}
    for kv in ("bf16", "int8"):
        eng = Engine.load(str(src), device="emu", buckets=(64,), cache_dir=tmp / "k", progress=False, context=256,
                          kv=kv, warmup=False)
        logits = [np.asarray(eng.prefill([5, 17, 42, 7, 99, 3]).logits, np.float32)]
        caches = {n: eng.cache.read_state(n, "L0", 0, 6) for n in eng.states.per_layer}   # layer 0: same inputs
        toks = []
        for _ in range(4):
            toks.append(int(np.argmax(logits[-1])))
            logits.append(np.asarray(eng.decode_step(toks[-1]), np.float32))
        out[kv] = (eng, logits, caches, toks)
    return out


def test_cache_rows_are_the_bf16_rows_quantized(runs):
    _, _, c16, _ = runs["bf16"]
    _, _, c8, _ = runs["int8"]
    assert set(c8) == {"kv8_cache"}
    rows = np.asarray(c8["kv8_cache"]).view(np.int8).reshape(6, row_bytes(2, 32))
    want = pack_rows(np.asarray(c16["k_cache"], np.float32), np.asarray(c16["v_cache"], np.float32), 2, 32)
    np.testing.assert_array_equal(rows, want)


def test_logits_close_to_bf16(runs):
    _, l16, _, _ = runs["bf16"]
    _, l8, _, _ = runs["int8"]
    assert not all(np.array_equal(a, b) for a, b in zip(l16, l8))      # the int8 cache is really read
    for a, b in zip(l16, l8):
        assert np.abs(a - b).max() <= 0.05 * np.abs(a).max() + 1e-3


def test_memory_plan_holds_int8_rows():
    from llama_npu.memory import plan_memory
    from llama_npu.models.llama import LLAMA32_1B
    p16 = plan_memory(LLAMA32_1B, [64], 32768)
    p8 = plan_memory(LLAMA32_1B, [64], 32768, kv="int8")
    rope = 32768 * 64 * 2
    assert p16.kv_cache_bytes - rope == 16 * 32768 * 2 * 512 * 2                   # 1.07 GB of bf16 K and V
    assert p8.kv_cache_bytes - rope == 16 * 32768 * row_bytes(8, 64)               # int8 codes + f32 scales
    assert p8.scratch_bytes >= 2 * 32768 * 512 * 2                                 # the prefill's bf16 window


def test_decode_modules_fit_at_llama32_1b():
    from kernel_builder.hw import analyze_module
    from llama_npu.models.llama import LLAMA32_1B, LlamaModel
    from multi_launch_builder.stitcher import stitch
    m = LlamaModel(LLAMA32_1B, "q4", kv="int8")
    d = m.decode(32768).decls[0]
    assert [la.prefix for la in d.launches if "attn" in la.prefix] == ["attn_kq", "attn_vq", "attn"]
    rep = analyze_module(stitch(d), d.name)
    assert rep.ok, rep.first_violation()


def test_unsupported_combinations_are_one_line(tmp_path):
    from llama_npu.engine import Engine
    from llama_npu.models.llama import LLAMA32_1B, LlamaModel
    with pytest.raises(ValueError, match="kv must be one of"):
        LlamaModel(LLAMA32_1B, kv="int4")
    src = write_numpy_checkpoint(tmp_path / "m", hidden=128, n_heads=4, n_kv_heads=2, ffn=256, n_layers=1, vocab=256,
                                 max_position=256)
    with pytest.raises(ValueError, match="needs the decode attention on the NPU"):
        Engine.load(str(src), device="emu", buckets=(64,), cache_dir=tmp_path / "k", progress=False, context=256,
                    kv="int8", decode_attention="host", warmup=False)


def test_one_dispatch_token_equals_per_layer_decode(tmp_path):
    """The one-module greedy token (llama_npu/models/token.py, derived from the per-layer decode) over the KV8
    cache gives the per-layer decode's tokens, across a KV window change, with one dispatch per token."""
    from llama_npu.engine import Engine
    src = write_numpy_checkpoint(tmp_path / "m", hidden=128, n_heads=4, n_kv_heads=2, ffn=256, n_layers=2, vocab=250,
                                 max_position=512, seed=3)
    eng = Engine.load(str(src), device="emu", buckets=(64,), cache_dir=tmp_path / "k", progress=False, context=512,
                      kv="int8")
    assert eng.token_decode is not None
    prompt = [int(t) for t in np.random.default_rng(1).integers(3, 250, size=250)]
    eng.cache.reset_counters()
    one = eng.generate(prompt, 10).tokens      # decode crosses the 256-position window into 512
    rows = {r["module"]: r for r in eng.cache.report()}
    assert {n for n in rows if n.startswith("token_kv")} == {"token_kv256", "token_kv512"}
    assert not any(n.startswith("layer_kv") for n in rows)
    eng.token_decode = None
    eng.reset()
    assert eng.generate(prompt, 10).tokens == one


def test_token_module_fits_at_llama32_1b():
    from kernel_builder.hw import analyze_module
    from llama_npu.models.llama import LLAMA32_1B, LlamaModel
    from llama_npu.models.token import token_module
    from multi_launch_builder.stitcher import stitch
    d = token_module(LlamaModel(LLAMA32_1B, "q4", kv="int8"), 32768)
    assert sum(la.prefix.endswith("attn") for la in d.launches) == 16
    rep = analyze_module(stitch(d), d.name)
    assert rep.ok, rep.first_violation()


def test_later_prefill_chunks_attend_over_the_int8_history(tmp_path):
    """A 200-token prompt in chunks of 64 (the later chunks attend over the dequantized KV8 history) gives the
    logits of one 256-row chunk, bit for bit: the cache's values do not depend on how the prompt was cut."""
    from llama_npu.engine import Engine
    src = write_numpy_checkpoint(tmp_path / "m", hidden=128, n_heads=4, n_kv_heads=2, ffn=256, n_layers=2, vocab=256,
                                 max_position=512, seed=5)
    prompt = [int(t) for t in np.random.default_rng(2).integers(3, 256, size=200)]
    out = {}
    for b in (64, 256):
        eng = Engine.load(str(src), device="emu", buckets=(b,), cache_dir=tmp_path / "k", progress=False,
                          context=512, kv="int8", warmup=False)
        out[b] = np.asarray(eng.prefill(prompt).logits, np.float32)
    np.testing.assert_array_equal(out[64], out[256])     # bit for bit (as the bf16 cache's prefill)


def test_interpreted_air_matches_reference_emulation(tmp_path):
    """The KV8 runtime on emu-interp (every herd, DMA pattern - the query rows' bf16 -> int8 byte DMA included - and
    external call of the generated text) gives the reference emulator's tokens and logits (2 bf16 ulps)."""
    from llama_npu.engine import Engine
    src = write_numpy_checkpoint(tmp_path / "m", hidden=64, n_heads=2, n_kv_heads=1, ffn=128, vocab=256,
                                 max_position=64, seed=3)
    runs = {}
    for device in ("emu", "emu-interp"):
        eng = Engine.load(str(src), device=device, buckets=(16,), cache_dir=tmp_path / "k", progress=False,
                          warmup=False, kv="int8")
        steps = []
        res = eng.generate([1, 7, 9, 11, 13, 15], max_new_tokens=3, on_logits=lambda s, lg: steps.append(lg.copy()))
        runs[device] = (res.tokens, steps)
    assert runs["emu"][0] == runs["emu-interp"][0]
    for a, b in zip(runs["emu"][1], runs["emu-interp"][1]):
        np.testing.assert_allclose(b, a, atol=2 * 2.0**-8 * float(np.abs(a).max()), rtol=0)
