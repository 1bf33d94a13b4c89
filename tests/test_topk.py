"""The `topk` kernel (on-device greedy argmax / top-k candidates of the decode token): the numpy reference against
np.argmax / a sort, the C++ scalar path and the AIE2P vector path (host aie_api, with its counts against the cost
descriptor) bit for bit against the reference, an off-by-one mutant that fails, the builder on emu-interp, and
the hardware model at LM-head partition shapes."""
from __future__ import annotations

import ctypes
import re
import subprocess

import numpy as np
import pytest
from tooling import require_tool

from external_kernels import compile_rules
from external_kernels.paths import SOURCE_DIR
from kernel_builder import aie_host
from kernel_builder.instr_counts import Counts
from kernel_builder.numerics import BF16, to_bf16
from kernel_builder.topk import external as tk_ext
from kernel_builder.topk.reference import candidates, empty, topk

# (n, k, base, valid): a full partition, a padded tail partition, k > 1, a 32-multiple that is not a 64 one
VARIANTS = [(1024, 1, 0, 1024), (512, 1, 1536, 300), (256, 4, 256, 256), (96, 3, 0, 90)]


def _logits(n, seed, ties=False):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(n).astype(np.float32) * 4
    if ties:      # few distinct values: ties everywhere (the smaller id must win), -0 beside +0
        x = np.round(x)
        x[::7] = -0.0
    return to_bf16(x)


def _prev(k, seed):
    """Candidates of an earlier partition (ids < 100) with values in the logits' range, sorted."""
    rng = np.random.default_rng(seed)
    vals = np.sort(to_bf16(rng.standard_normal(k).astype(np.float32) * 4).astype(np.float32))[::-1]
    ids = np.sort(rng.choice(100, size=k, replace=False)).astype(np.int32)
    order = np.lexsort((ids, -vals))
    return np.concatenate([ids[order], vals[order].view(np.int32)]).reshape(1, -1)


def test_reference_is_argmax_and_sorted_top_k():
    x = _logits(1024, 1, ties=True)
    out = topk(x, empty(1), n=1024, k=1, base=0, valid=1024)
    ids, vals = candidates(out)
    assert ids.tolist() == [int(np.argmax(x.astype(np.float32)))]            # the first maximum
    out = topk(x, empty(5), n=1024, k=5, base=0, valid=1024)
    ids, vals = candidates(out)
    want = sorted(range(1024), key=lambda i: (-float(x[i]), i))[:5]
    assert ids.tolist() == want and np.all(np.diff(vals) <= 0)
    # a chain over two partitions = the argmax of their concatenation; the padded tail never wins
    y = _logits(512, 2)
    y[400:] = 100.0
    c = topk(x, empty(1), n=1024, k=1, base=0, valid=1024)
    c = topk(y, c, n=512, k=1, base=1024, valid=400)
    both = np.concatenate([x, y[:400]]).astype(np.float32)
    assert candidates(c)[0].tolist() == [int(np.argmax(both))]
    with pytest.raises(ValueError, match="prev has 3 elements"):
        topk(x, np.zeros(3, np.int32), n=1024, k=1, base=0, valid=1024)


@pytest.fixture(scope="module")
def scalar_lib(tmp_path_factory):
    cxx = require_tool("g++")
    out = tmp_path_factory.mktemp("topk_host")
    objs = []
    for v in VARIANTS:
        k = tk_ext.topk_kernel(*v)
        cmd = compile_rules.host_compile_command(k, out, cxx=cxx) + ["-Wall", "-Wextra"]
        res = subprocess.run(cmd, capture_output=True, text=True)
        assert res.returncode == 0 and "warning" not in res.stderr, res.stderr
        objs.append(out / compile_rules.host_object_name(k))
    so = out / "libtopk.so"
    subprocess.run(compile_rules.host_link_command(objs, so, cxx=cxx), check=True)
    return ctypes.CDLL(str(so))


def _case(v, seed, ties):
    n, k, base, valid = v
    x = _logits(n, seed, ties)
    prev = empty(k) if seed % 2 else _prev(k, seed)
    return x, prev, topk(x, prev, n=n, k=k, base=base, valid=valid).reshape(-1)


@pytest.mark.parametrize("v", VARIANTS)
@pytest.mark.parametrize("seed,ties", [(3, False), (4, True)])
def test_scalar_path_matches_reference(scalar_lib, v, seed, ties):
    x, prev, want = _case(v, seed, ties)
    out = np.zeros(2 * v[1], np.int32)
    f = getattr(scalar_lib, tk_ext.topk_kernel(*v).symbol)
    f.argtypes = [ctypes.c_void_p] * 3
    p = np.ascontiguousarray(prev.reshape(-1))
    f(x.ctypes.data, p.ctypes.data, out.ctypes.data)
    np.testing.assert_array_equal(out, want)


def _vector_run(v, x, prev, lib=None):
    kern = tk_ext.topk_kernel(*v)
    lib = lib or aie_host.load(kern)
    out = aie_host.aligned(np.zeros(2 * v[1], np.int32))
    counts = lib.call(kern.symbol, aie_host.aligned(x), aie_host.aligned(np.ascontiguousarray(prev.reshape(-1))),
                      out)
    return out, counts


@pytest.mark.parametrize("v", VARIANTS)
@pytest.mark.parametrize("seed,ties", [(3, False), (4, True)])
def test_vector_path_matches_reference(v, seed, ties):
    x, prev, want = _case(v, seed, ties)
    out, counts = _vector_run(v, x, prev)
    np.testing.assert_array_equal(out, want)
    cost = tk_ext.COSTS[0]
    kern = tk_ext.topk_kernel(*v)
    formula = cost.work(cost.pattern.fullmatch(kern.symbol), []).counts
    assert Counts._of(formula).host() == {k2: n for k2, n in counts.items() if n}


def test_off_by_one_in_the_vector_path_fails(tmp_path):
    v = VARIANTS[0]
    text = (SOURCE_DIR / "topk.cc").read_text()
    mutated, n = re.subn(r"for \(int j = kLanes; j < TOPK_BLOCK;", "for (int j = kLanes; j < TOPK_BLOCK - kLanes;",
                         text)
    assert n == 1
    src = tmp_path / "topk.cc"
    src.write_text(mutated)
    x = _logits(v[0], 7)
    x[:] = to_bf16(np.float32(-5.0))
    x[511] = to_bf16(np.float32(3.0))       # the max in the last vector of block 1: the mutant never sees it
    want = topk(x, empty(1), n=v[0], k=1, base=0, valid=v[0]).reshape(-1)
    out, _ = _vector_run(v, x, empty(1), aie_host.load(tk_ext.topk_kernel(*v), source=src))
    assert candidates(want)[0].tolist() == [511]
    assert candidates(out)[0].tolist() != [511]


@pytest.mark.parametrize("v", VARIANTS[:3])
def test_builder_on_the_interpreter(v):
    from multi_launch_builder.emulator import air_interp
    from kernel_builder.registry import kernel_text
    n, k, base, valid = v
    x, prev, want = _case(v, 5, False)
    out = np.zeros((1, 2 * k), np.int32)
    air_interp.compile_module(kernel_text("topk", *v)).run([x.reshape(1, n), prev, out])
    np.testing.assert_array_equal(out.reshape(-1), want)


@pytest.mark.parametrize("n,k,base,valid", [(16384, 1, 114688, 13440), (16384, 8, 0, 16384), (6144, 1, 0, 6144),
                                            (24576, 1, 0, 24576)])
def test_hardware_model_accepts_lm_head_partitions(n, k, base, valid):
    from kernel_builder.hw import analyze_module
    from kernel_builder.registry import kernel_text
    rep = analyze_module(kernel_text("topk", n, k, base, valid))
    assert rep.ok, rep.first_violation()


def test_bad_shapes_are_one_line():
    from kernel_builder.topk.plan import plan_topk
    with pytest.raises(ValueError, match="k=17 is more than the 16"):
        plan_topk(1024, 17, 0, 1024)
    with pytest.raises(ValueError, match="n=100 must be a multiple of 32"):
        plan_topk(100, 1, 0, 100)
    with pytest.raises(ValueError, match="of L1"):
        plan_topk(65536, 1, 0, 65536)
