"""The runtime on the emu device against HF transformers bf16 (eager attention) on random-weight
checkpoints: greedy tokens per the verify gate rule, last-row logits cosine, padding invariance,
EOS inside the prompt, stopping and context limits."""
from __future__ import annotations

import numpy as np
import pytest

from llama_npu.engine import Engine
from llama_npu.errors import PromptError
from llama_npu.models.graph import prefill_plan

from tooling import require_module

torch = require_module("torch")
require_module("transformers")

LLAMA32_1B_2L = dict(hidden=2048, n_heads=32, n_kv_heads=8, head_dim=64, ffn=8192, n_layers=2, vocab=4096)
LLAMA32_3B_1L = dict(hidden=3072, n_heads=24, n_kv_heads=8, head_dim=128, ffn=8192, n_layers=1, vocab=4096)
SMALL = dict(hidden=256, n_heads=4, n_kv_heads=2, head_dim=64, ffn=512, n_layers=2, vocab=512)
LLAMA3_SCALING = {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                  "original_max_position_embeddings": 8192}
N_DECODE = 6
TOP = 5


def load_engine(model_dir, buckets, cache_dir) -> Engine:
    return Engine.load(str(model_dir), device="emu", buckets=buckets, cache_dir=cache_dir, progress=False)


def hf_greedy(model_dir, ids: list[int], steps: int) -> list[np.ndarray]:
    """Logits of HF's own greedy run: prefill logits, then one per decode step (f32 copies)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.bfloat16,
                                                 attn_implementation="eager").eval()
    out_logits = []
    with torch.no_grad():
        out = model(torch.tensor([ids]), use_cache=True)
        for _ in range(steps):
            logits = out.logits[0, -1].float().numpy()
            out_logits.append(logits)
            nxt = int(np.argmax(logits))
            out = model(torch.tensor([[nxt]]), past_key_values=out.past_key_values, use_cache=True)
    return out_logits


def ours_greedy(eng: Engine, ids: list[int], steps: int) -> list[np.ndarray]:
    logits = [eng.prefill(ids).logits]
    while len(logits) < steps:
        logits.append(eng.decode_step(int(np.argmax(logits[-1]))))
    return logits


def gate(ours: list[np.ndarray], ref: list[np.ndarray]) -> int:
    """Verify gate (verify.gate's tie order): walk both greedy sequences in lockstep; at the first
    differing step each side's token must be in the other side's top-5, and that step ends the
    comparison. Returns steps matched."""
    from verify.gate import greedy_token, topk_ids

    for step, (a, b) in enumerate(zip(ours, ref)):
        ta, tb = greedy_token(a), greedy_token(b)
        if ta != tb:
            assert ta in topk_ids(b, TOP), f"step {step}: our token {ta} not in HF top-{TOP}"
            assert tb in topk_ids(a, TOP), f"step {step}: HF token {tb} not in our top-{TOP}"
            return step
    return len(ours)


def cosine(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def prompt_ids(vocab: int, n: int, seed: int = 0) -> list[int]:
    rng = np.random.default_rng(seed)
    return [1] + rng.integers(3, vocab, size=n - 1).tolist()


def check_against_hf(model_dir, eng, ids, steps=N_DECODE):
    ours = ours_greedy(eng, ids, steps)
    ref = hf_greedy(model_dir, ids, steps)
    assert cosine(ours[0], ref[0]) >= 0.99
    matched = gate(ours, ref)
    for a, b in zip(ours[:matched], ref[:matched]):
        assert cosine(a, b) >= 0.99
    return matched


@pytest.mark.parametrize("shape", [LLAMA32_1B_2L, LLAMA32_3B_1L], ids=["llama32-1b-2layers", "llama32-3b-1layer"])
def test_llama32_shapes_match_hf(hf_checkpoint, kernel_cache_dir, shape):
    model_dir = hf_checkpoint(**shape, rope_scaling=LLAMA3_SCALING, max_position=131072)
    eng = load_engine(model_dir, (16,), kernel_cache_dir)
    check_against_hf(model_dir, eng, prompt_ids(shape["vocab"], 11))


@pytest.mark.parametrize("original", [8192, 32])
def test_llama3_rope_scaling_matches_hf(hf_checkpoint, kernel_cache_dir, original):
    """llama3 rope_scaling, incl. positions beyond original_max_position_embeddings (original=32)."""
    scaling = {**LLAMA3_SCALING, "original_max_position_embeddings": original}
    model_dir = hf_checkpoint(**SMALL, rope_scaling=scaling, max_position=max(4096, 2 * original), seed=3)
    eng = load_engine(model_dir, (16, 64), kernel_cache_dir)
    matched = check_against_hf(model_dir, eng, prompt_ids(SMALL["vocab"], 40, seed=1), steps=12)
    assert eng.pos >= 40 + matched - 1


def test_qk_norm_variant_matches_hf_qwen3(hf_checkpoint, kernel_cache_dir):
    """The Qwen3-style variant (per-head q/k RMSNorm before RoPE), described by one flag in the model
    description, against transformers' Qwen3ForCausalLM on a random-weight checkpoint."""
    model_dir = hf_checkpoint(**SMALL, arch="qwen3", rope_theta=1000000.0, max_position=512, seed=9)
    eng = load_engine(model_dir, (16, 64), kernel_cache_dir)
    assert eng.model.qk_norm and "q_norm" in [a.name for a in eng.plans[prefill_plan(16, 16)].steps[0].decl.args]
    check_against_hf(model_dir, eng, prompt_ids(SMALL["vocab"], 13, seed=6))


@pytest.fixture(scope="module")
def small(hf_checkpoint, kernel_cache_dir):
    model_dir = hf_checkpoint(**SMALL, max_position=256, tie=True, seed=5)
    return model_dir, load_engine(model_dir, (16, 64), kernel_cache_dir)


def test_tied_embeddings_match_hf(small):
    model_dir, eng = small
    check_against_hf(model_dir, eng, prompt_ids(SMALL["vocab"], 9, seed=2))


def test_padding_invariance_bit_identical(small):
    """Every prompt length that fits bucket 16 gives the same bytes in bucket 64: causal attention and
    per-row ops mean padding rows can never reach a real row (rows at the end of a bucket included)."""
    _, eng = small
    rng = np.random.default_rng(4)
    for n in range(1, 17):
        ids = [1] + rng.integers(3, SMALL["vocab"], size=n - 1).tolist()
        a = eng.prefill(ids, return_hidden=True, bucket=16)
        b = eng.prefill(ids, return_hidden=True, bucket=64)
        assert (a.bucket, b.bucket) == (16, 64)
        assert a.last_hidden.tobytes() == b.last_hidden.tobytes(), f"prompt length {n}"
        for layer, (ha, hb) in enumerate(zip(a.hidden, b.hidden)):
            assert ha.shape == (n, SMALL["hidden"])
            assert np.array_equal(ha, hb), f"prompt length {n}, layer {layer}: rows {np.flatnonzero((ha != hb).any(1))}"
        assert np.array_equal(a.logits, b.logits)
    # the KV-cache rows of the real prompt are identical too, so decode continues identically
    eng.prefill(ids, bucket=64)
    after_64 = eng.decode_step(7)
    eng.prefill(ids, bucket=16)
    assert np.array_equal(eng.decode_step(7), after_64)


def test_prompt_containing_eos_keeps_its_length(small):
    model_dir, eng = small
    eos = eng.tokenizer.token_to_id("</s>")
    assert eos in eng.stop_ids
    ids = [1, 40, eos, 41, 42, eos, eos, 43]
    res = eng.prefill(ids)
    assert res.prompt_len == len(ids) and eng.pos == len(ids)
    ref = hf_greedy(model_dir, ids, 1)[0]
    assert cosine(res.logits, ref) >= 0.99
    # a prompt that *ends* in EOS is still taken at its full length
    res2 = eng.prefill(ids + [eos])
    assert res2.prompt_len == len(ids) + 1
    assert cosine(res2.logits, hf_greedy(model_dir, ids + [eos], 1)[0]) >= 0.99


def test_generate_streams_and_stops(small):
    _, eng = small
    eos = eng.tokenizer.token_to_id("</s>")
    ids = eng.tokenizer.apply_chat_template([{"role": "user", "content": "what is the capital of france"}])
    assert ids[0] == 1 and ids[-1] == eng.tokenizer.token_to_id("<|assistant|>")
    deltas, seen = [], []
    script = iter([10, 11, eos, 12])
    res = eng.generate(ids, 10, sampler=lambda logits: next(script), on_token=lambda t, d: deltas.append(d),
                       on_logits=lambda step, logits: seen.append((step, logits.shape)))
    assert res.tokens == [10, 11, eos] and res.stop_reason == "eos"
    assert [s for s, _ in seen] == [0, 1, 2] and all(sh == (SMALL["vocab"],) for _, sh in seen)
    assert "".join(deltas) == res.text == eng.tokenizer.decode([10, 11])
    assert res.ttft_s > 0 and res.decode_tok_s > 0 and res.ms_per_token > 0
    greedy = eng.generate(ids, 4)
    assert len(greedy.tokens) <= 4 and greedy.stop_reason in ("eos", "length")


def test_generate_stop_event_and_limits(small):
    import threading

    _, eng = small
    ids = prompt_ids(SMALL["vocab"], 5)
    stop = threading.Event()
    res = eng.generate(ids, 50, sampler=lambda logits: 20, on_token=lambda t, d: stop.set(), stop_event=stop)
    assert res.stop_reason == "interrupted" and res.tokens == [20]
    with pytest.raises(PromptError, match="exceeds the model's context of 256"):
        eng.generate(ids, 252)
    with pytest.raises(PromptError, match=r"bucket 16 cannot hold positions \[0, 65\)"):
        eng.prefill(prompt_ids(SMALL["vocab"], 65), bucket=16)
    assert eng.prefill(prompt_ids(SMALL["vocab"], 65)).prompt_len == 65   # past the largest bucket: in chunks
    with pytest.raises(PromptError, match="empty prompt"):
        eng.generate([], 1)
    # the KV cache grows on demand when decode runs past the prefill-time capacity
    eng.prefill(ids)
    for _ in range(70):
        eng.decode_step(21)
    assert eng.pos == 75 and eng.kv_capacity >= 75


def test_text_stream_deltas_equal_full_decode_with_byte_level_bpe(tmp_path):
    """Streaming decodes a short window per token (not the whole reply) yet yields exactly the full
    text, including multi-byte characters split across byte-level BPE tokens."""
    from tokenizers import Tokenizer as HFTokenizer, decoders, models, pre_tokenizers, trainers

    from llama_npu.generation import TextStream
    from llama_npu.tokenizer import Tokenizer

    corpus = ["Héllo wörld, naïve café: 你好，世界 🚀🔥", "def f(x):\n    return x ** 2  # done", "the cat sat"] * 20
    hf = HFTokenizer(models.BPE())
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    hf.decoder = decoders.ByteLevel()
    hf.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    hf.save(str(tmp_path / "tokenizer.json"))
    tok = Tokenizer(tmp_path)
    calls = []
    real_decode = tok.decode
    tok.decode = lambda ids, **kw: calls.append(len(ids)) or real_decode(ids, **kw)
    text = "Tell me: 你好 🚀 café?\n  ok " * 3
    ids = tok.encode(text, add_special_tokens=False)
    deltas = []
    stream = TextStream(tok, lambda t, d: deltas.append(d))
    for i in range(1, len(ids) + 1):
        stream.push(ids[:i])
    assert "".join(deltas) == real_decode(ids) == text
    assert max(calls) <= 8, "each push must decode a short window, not the whole token list"
