"""SwiGLU over the (gate, up) pairs of one interleaved input (kernel_builder/swiglu/builder.py `pairs`: the decode
GEMV's output over the gate/up weight interleaved by 8 rows, kernel_builder/gemm_swiglu/layout.py): the module run
by the AIR interpreter (its DMA access patterns, the external kernel's numpy model) equals the reference, which
equals SwiGLU of the split halves; an up DMA one block off (reading the gates) changes the result."""
from __future__ import annotations

import re

import numpy as np
import pytest

from kernel_builder.gemm_swiglu.layout import PAIR, interleave, split
from kernel_builder.numerics import to_bf16
from kernel_builder.reference import KERNELS
from kernel_builder.swiglu import builder
from multi_launch_builder.devices.interp import InterpEmuDevice
from test_air_interp import _artifact, _run

SHAPES = [(1, 256), (1, 1536), (3, 128)]


def _data(rows: int, dim: int):
    rng = np.random.default_rng(rows * dim)
    return to_bf16((rng.standard_normal((rows, 2 * dim)) * 2).astype(np.float32))


@pytest.mark.parametrize("rows,dim", SHAPES)
def test_pairs_module_matches_reference(tmp_path, rows, dim):
    gu = _data(rows, dim)
    want = KERNELS["swiglu"](gu, gu, rows=rows, dim=dim, pairs=PAIR)
    g, u = (x.T for x in split(gu.T))   # the halves of every row
    np.testing.assert_array_equal(want, KERNELS["swiglu"](g, u, rows=rows, dim=dim))
    y = np.zeros((rows, dim), gu.dtype)
    got = _run(InterpEmuDevice(), _artifact(tmp_path, "swp", builder.build(rows, dim, PAIR)), [gu, gu, y])[2]
    np.testing.assert_array_equal(got, want.astype(np.float32))


def test_up_one_block_off_is_caught(tmp_path):
    rows, dim = 1, 256
    text = builder.build(rows, dim, PAIR)
    # the up DMA's column offset 8 (its odd blocks) -> 0: it reads the gates
    mutated, n = re.subn(r"(%up_l1\[\] \[\] \[\], %\w+\[%\w+, )%c8\w*\]", r"\1%c0]", text)
    assert n == 1 and "%c0 =" in text
    gu = _data(rows, dim)
    y = np.zeros((rows, dim), gu.dtype)
    good = _run(InterpEmuDevice(), _artifact(tmp_path, "good", text), [gu, gu, y])[2]
    bad = _run(InterpEmuDevice(), _artifact(tmp_path, "bad", mutated), [gu, gu, y])[2]
    assert not np.array_equal(good, bad)
    # and interleave / split are inverse row permutations
    a, b = np.arange(32 * 3).reshape(32, 3), -np.arange(32 * 3).reshape(32, 3)
    assert all(np.array_equal(x, y) for x, y in zip(split(interleave(a, b)), (a, b)))
