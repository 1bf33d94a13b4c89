"""Device-side hand-off (Engine(alias=True), KernelCache refs) against the host round-trip path
(alias=False): the emu runs the same launches on the same bytes, so logits, hidden states and KV-cache
bytes must be bit-identical, while the host transfers far fewer bytes."""
from __future__ import annotations

import numpy as np
import pytest

from checkpoints import write_numpy_checkpoint
from llama_npu.engine import Engine


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    root = tmp_path_factory.mktemp("alias")
    model = write_numpy_checkpoint(root / "model", n_layers=3, seed=11)
    return [Engine.load(str(model), device="emu", buckets=(16, 64), cache_dir=root / "kernels", progress=False,
                        alias=alias) for alias in (True, False)]


def _traffic(eng) -> tuple[int, int]:
    rows = eng.cache.report()
    return sum(r["bytes_written"] for r in rows), sum(r["bytes_read"] for r in rows)


@pytest.mark.parametrize("n,bucket", [(1, 16), (13, 16), (40, 64)])
def test_alias_is_bit_identical_to_host_round_trips(engines, n, bucket):
    rng = np.random.default_rng(n)
    ids = [1] + rng.integers(3, 512, size=n - 1).tolist()
    results, kv, decode, traffic = [], [], [], []
    for eng in engines:
        eng.cache.reset_counters()
        for return_hidden in (False, True):
            r = eng.prefill(ids, return_hidden=return_hidden, bucket=bucket)
        traffic.append(_traffic(eng))
        results.append(r)
        kv.append((eng.kv.k[:, :, :n].tobytes(), eng.kv.v[:, :, :n].tobytes()))
        decode.append([eng.decode_step(7 + i) for i in range(3)])
    a, b = results
    assert a.logits.tobytes() == b.logits.tobytes()
    assert a.last_hidden.tobytes() == b.last_hidden.tobytes()
    assert len(a.hidden) == len(b.hidden) == 3
    for ha, hb in zip(a.hidden, b.hidden):
        assert ha.tobytes() == hb.tobytes()
    assert kv[0] == kv[1]
    for la, lb in zip(*decode):
        assert la.tobytes() == lb.tobytes()
    (wa, ra), (wb, rb) = traffic
    assert wa < wb and ra < rb


def test_alias_prefill_transfers_only_what_the_host_needs(engines):
    """Per prefill: the embedding in, K/V of every layer + the last layer's hidden + logits out."""
    eng = engines[0]
    s = eng.shapes
    eng.prefill([1, 5, 9], bucket=16)
    eng.cache.reset_counters()
    eng.prefill([1, 5, 9], bucket=16)
    c = eng.cache.counters
    assert c["rms_gemms_rope_s16"].bytes_written == 16 * s.hidden * 2          # layer 0's x only
    assert c["rms_gemms_rope_s16"].bytes_read == s.n_layers * 2 * 16 * s.kv_dim * 2   # k_roped + v
    assert (c["flash_attn_s16"].bytes_written, c["flash_attn_s16"].bytes_read) == (0, 0)
    assert c["o_ffn_s16"].bytes_written == 0
    assert c["o_ffn_s16"].bytes_read == 16 * s.hidden * 2                      # the last layer's x_out
