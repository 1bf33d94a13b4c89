"""kernel_builder.block_float: the bfp16ebs8 at-rest weight bytes (layout of mlir-aie's block_datatypes/helper.h:
per 8 values [E, m0 .. m7], 8x8 blocks block-row major) and its rounding (kernel_builder.numerics.to_bfp16ebs8)."""
import numpy as np
import pytest

from kernel_builder import block_float as bf
from kernel_builder.numerics import to_bf16, to_bfp16ebs8


def _w(n=64, k=128, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((n, k)) * np.exp(rng.uniform(-6, 6, (n, 1)))).astype(np.float32)


def test_round_trip_is_the_block_float_model_and_bf16_exact():
    w = _w()
    w[1, 8:16] = 0.0                                     # an all-zero group
    w[2, :8] = [127.6, 1, 2, 3, -4, 5, 6, 7]             # rounds up past 127: clipped mantissa
    q = bf.quantize(w)
    assert np.array_equal(q, to_bfp16ebs8(w))
    assert np.array_equal(to_bf16(q).astype(np.float32), q)     # every kept value is a bf16 value
    assert np.abs(q - w).max() <= np.abs(w).max() * 2.0 ** -7


def test_published_byte_layout():
    w = np.zeros((16, 16), np.float32)
    w[0, :8] = [1.0, -1.0, 0.5, 0, 0, 0, 0, 0.015625]    # group max 1.0: E = 127, m = x * 64
    w[9, 8:16] = 4.0                                     # block (1, 1), row 1: E = 129, m = 64
    b = bf.encode(w)
    assert b.shape == (2, 144) and b.dtype == np.uint8
    assert list(b[0, :9]) == [127, 64, 256 - 64, 32, 0, 0, 0, 0, 1]
    assert list(b[1, 72 + 9:72 + 18]) == [129] + [64] * 8
    assert b[0, 9] == 0 and not b[0, 10:18].any()        # row 1 of block (0, 0): zeros, exponent field 0


def test_tiny_groups_flush_to_the_smallest_exponent():
    w = np.zeros((8, 8), np.float32)
    w[0, 0], w[0, 1] = 2.0 ** -130, 2.0 ** -127
    b = bf.encode(w)
    assert b[0, 0] == 0                                   # E = 0: e = -127
    q = bf.decode(b, 8, 8)
    assert q[0, 1] == 2.0 ** -127 and q[0, 0] == 2.0 ** -130


@pytest.mark.parametrize("shape", [(12, 16), (16, 12), (0, 8)])
def test_bad_shapes(shape):
    with pytest.raises(ValueError, match="multiples of 8"):
        bf.encode(np.zeros(shape, np.float32))


def test_non_finite_and_wrong_sizes_are_rejected():
    w = _w(8, 16)
    w[3, 5] = np.nan
    with pytest.raises(ValueError, match="inf or NaN"):
        bf.encode(w)
    with pytest.raises(ValueError, match="expected 144 bytes"):
        bf.decode(np.zeros(143, np.uint8), 8, 16)


def test_chunked_conversion_matches_one_shot():
    w = _w(2048 + 64, 64, seed=3)       # more rows than one conversion chunk
    assert np.array_equal(bf.decode(bf.encode(w), *w.shape), to_bfp16ebs8(w))
