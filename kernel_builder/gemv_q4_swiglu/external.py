"""The `gemv_q4_swiglu` kernel's external C++ kernel: external_kernels/gemv_q4.cc compiled with -DQ4_SWIGLU_SYMBOL,
one object holding two entries: the GEMV step (`mvq4s_bf16_k<K>_g<G>_z<Z>_m<M>_r<2R>`, the 4-bit GEMV's code and
numpy model) and the SwiGLU of the tile's outputs (`mvq4a_bf16_...`: swiglu.cc's code on y[0, R) and y[R, 2R));
their costs are the 4-bit GEMV's and the swiglu kernel's at R elements."""
from __future__ import annotations

import functools
import re

from kernel_builder.external_costs import DEFAULT_STACK, ExternalCost
from kernel_builder.external_models import need_memref
from kernel_builder.externals import ExternalFamily
from kernel_builder.gemv_q4.external import _gemv_q4, gemv_q4_kernel, gemv_q4_model
from kernel_builder.swiglu.external import _swiglu
from kernel_builder.swiglu.reference import swiglu

_TAG = r"k(\d+)_g(\d+)_z(\d)_m(\d+)_r(\d+)"


def _model(part: str, k: int, group: int, mins: int, tm: int, rows: int):
    """The numpy model of an entry: the GEMV step, or the SwiGLU of y [rows] into act [rows / 2]."""
    if part == "s":
        return gemv_q4_model(k, group, mins, tm, rows)
    half = rows // 2

    def act(y, out):
        ys = need_memref(y, "y", rows)
        need_memref(out, "act", half)[:] = swiglu(ys[:half], ys[half:], rows=1, dim=half).reshape(-1)
        out.written = True
    return act


def _swiglu_half(m, args):
    """The SwiGLU entry's work: the swiglu kernel's at rows / 2 elements."""
    return _swiglu(re.match(r"(\d+)", str(int(m.group(5)) // 2)), args)


FAMILY = ExternalFamily("gemv_q4_swiglu", "gemv_q4.cc", r"mvq4s_" + _TAG + r"\.o", r"mvq4(s|a)_bf16_" + _TAG,
                        functools.partial(gemv_q4_kernel, swiglu=True), _model)
COSTS = (
    # mvq4s(w, x, y, row): writes y only (the 4-bit GEMV step)
    ExternalCost("gemv_q4_swiglu", re.compile(r"mvq4s_bf16_" + _TAG + r"(?:_b(8))?"), _gemv_q4, DEFAULT_STACK, (2,),
                 ()),
    # mvq4a(y, act): reads y, writes act
    ExternalCost("gemv_q4_swiglu", re.compile(r"mvq4a_bf16_" + _TAG), _swiglu_half, DEFAULT_STACK, (1,), (1,)),
)
