"""`--weights bfp16` on every family (tiny random checkpoints: Qwen2 with biases tied and untied, Qwen3, Mistral's
sliding window, Phi-3's fused and partial-rotary rows, Gemma 3): against the bf16 engine on the checkpoint holding
the rounded layer weights (every fused / interleaved / permuted row of the bf16 run is encoded in the same order)
the block-float prefill and decode stay within the rounding of the linear layers' inputs to block float (the
prefill's block-float activations, the GEMV input), and the greedy tokens follow transformers on that checkpoint."""
from __future__ import annotations

import numpy as np
import pytest
from checkpoints import block_float_copy

from test_engine_hf import cosine, gate, hf_greedy, prompt_ids
from test_families import CASES, TINY
from tooling import require_module

require_module("torch")
require_module("transformers")


def _runs(src, rounded, ids, cache, steps=4):
    from llama_npu.engine import Engine
    runs = {}
    for label, path, mode in (("bfp", src, "bfp16"), ("ref", rounded, "bf16")):
        eng = Engine.load(str(path), device="emu", buckets=(16,), cache_dir=cache, progress=False, context=256,
                          weights_mode=mode, warmup=False)
        logits = [np.asarray(eng.prefill(ids).logits, np.float32)]
        for _ in range(steps):     # greedy on the bfp16 run's tokens for both: the same decode inputs
            t = int(np.argmax(logits[-1] if label == "bfp" else runs["bfp"][len(logits) - 1]))
            logits.append(np.asarray(eng.decode_step(t), np.float32))
        runs[label] = logits
    return runs


def _check(src, tmp_path, vocab):
    rounded = tmp_path / "rounded"
    block_float_copy(src, rounded)
    ids = prompt_ids(vocab, 13, seed=4)
    runs = _runs(src, rounded, ids, tmp_path / "k")
    assert all(cosine(a, b) >= 0.999 for a, b in zip(runs["bfp"], runs["ref"]))
    hf = hf_greedy(rounded, ids, 5)
    # the verify gate (a divergence only within the mutual top-5), after at least the prefill and one decode step:
    # the tiny random checkpoints have near-ties (Gemma 3's step 2: 0.660 vs 0.652, two bf16 steps apart)
    same = gate(runs["bfp"], hf)
    assert same >= 2
    # the logits of the steps with the same inputs (up to and including the first differing token's step)
    assert all(cosine(a, b) >= 0.99 for a, b in zip(runs["bfp"][:same + 1], hf[:same + 1]))


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_bfp16_family_prefill_is_the_rounded_bf16_run(hf_checkpoint, tmp_path, case):
    _check(hf_checkpoint(**TINY, **CASES[case]), tmp_path, TINY["vocab"])


def test_bfp16_gemma3(tmp_path):
    from checkpoints_gemma3 import make_gemma3_checkpoint
    from test_gemma3 import TINY as GEMMA_TINY
    _check(make_gemma3_checkpoint(tmp_path / "g3", **GEMMA_TINY, seed=3), tmp_path, GEMMA_TINY["vocab"])
