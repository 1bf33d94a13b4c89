"""The whole runtime on the interpreting emulator: the same tokens and logits as the reference emulator.

emu-interp executes every herd, DMA pattern and external-kernel call of the generated AIR text, so this
checks the builders' tiling end to end through prefill, the KV cache and decode (at a tiny shape, since
interpretation is slow).
"""
from __future__ import annotations

import numpy as np
import pytest

from checkpoints import write_numpy_checkpoint
from llama_npu.engine import Engine


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return write_numpy_checkpoint(tmp_path_factory.mktemp("interp") / "model", hidden=64, n_heads=2,
                                  n_kv_heads=1, ffn=128, vocab=256, max_position=64, seed=3)


def _run(model_dir, device, cache_dir):
    eng = Engine.load(str(model_dir), device=device, buckets=(16,), cache_dir=cache_dir, progress=False,
                      warmup=False)
    steps = []
    res = eng.generate([1, 7, 9, 11, 13, 15], max_new_tokens=4, on_logits=lambda s, lg: steps.append(lg.copy()))
    return res.tokens, steps


def test_interpreted_air_matches_reference_emulation(tiny_dir, tmp_path):
    ref_tokens, ref_logits = _run(tiny_dir, "emu", tmp_path / "k")
    int_tokens, int_logits = _run(tiny_dir, "emu-interp", tmp_path / "k")
    assert int_tokens == ref_tokens
    for a, b in zip(ref_logits, int_logits):
        scale = float(np.abs(a).max())
        # Interpretation accumulates matmuls per K tile in f32 (the reference uses f64): allow 2 bf16 ulps.
        np.testing.assert_allclose(b, a, atol=2 * 2.0**-8 * scale, rtol=0)
