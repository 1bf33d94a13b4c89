"""Device-side hand-off (ModuleExecutor handoff="device": refs bind the producer's buffer) against the host
round-trip policy (handoff="host": the same refs copied through the host): one engine code path, the emu runs
the same launches on the same bytes, so logits, hidden states and KV-cache bytes must be bit-identical,
while the device policy transfers far fewer bytes."""
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
                        handoff=policy) for policy in ("device", "host")]


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
        kv.append([eng.cache.read_state(name, f"L{layer}", 0, n).tobytes()
                   for layer in range(3) for name in ("k_cache", "v_cache")])
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
    """Per prefill: the embedding rows in, the logits out; K/V stay in the device cache, the last row
    reaches the LM head as a device ref."""
    eng = engines[0]
    s = eng.shapes
    eng.prefill([1, 5, 9], bucket=16)
    eng.cache.reset_counters()
    eng.prefill([1, 5, 9], bucket=16)
    c = eng.cache.counters
    assert (c["qkv_s16"].bytes_written, c["qkv_s16"].bytes_read) == (16 * s.hidden * 2, 0)   # layer 0's x only
    assert (c["attn_s16"].bytes_written, c["attn_s16"].bytes_read) == (0, 0)
    assert (c["ffn_s16"].bytes_written, c["ffn_s16"].bytes_read) == (0, 0)
    assert c["lm_head"].bytes_written == 0 and c["lm_head"].bytes_read == eng.model.lm_parts * eng.model.lm_rows * 2
    assert not [k for k in c if k.startswith("state:")]                          # nothing read from the cache
