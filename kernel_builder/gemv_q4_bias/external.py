"""The `gemv_q4_bias` kernel's external C++ kernel: external_kernels/gemv_q4.cc compiled with -DQ4_BIAS=1 under its
own symbol and object (`mvq4b_bf16_k<K>_g<G>_z<Z>_m<M>_r<R>`, `mvq4b_...o`); x carries the tile's bias rows after
the input vector. Its numpy model and cost are the 4-bit GEMV's with the epilogue (kernel_builder.gemv_q4)."""
from __future__ import annotations

import functools
import re

from kernel_builder.external_costs import DEFAULT_STACK, ExternalCost
from kernel_builder.externals import ExternalFamily
from kernel_builder.gemv_q4.external import _gemv_q4, gemv_q4_kernel, gemv_q4_model

FAMILY = ExternalFamily("gemv_q4_bias", "gemv_q4.cc", r"mvq4b_k(\d+)_g(\d+)_z(\d)_m(\d+)_r(\d+)(?:_b(8))?\.o",
                        r"mvq4b_bf16_k(\d+)_g(\d+)_z(\d)_m(\d+)_r(\d+)(?:_b(8))?",
                        functools.partial(gemv_q4_kernel, bias=True), functools.partial(gemv_q4_model, bias=True))
COSTS = (
    # gemv_q4_bias(w, x + b, y, row): writes y only
    ExternalCost("gemv_q4_bias", re.compile(FAMILY.symbol_re), functools.partial(_gemv_q4, bias=True),
                 DEFAULT_STACK, (2,), ()),
)
