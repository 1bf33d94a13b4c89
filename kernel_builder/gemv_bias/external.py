"""The `gemv_bias` kernel's external C++ kernel: external_kernels/gemv.cc compiled with -DGEMV_BIAS=1 under its
own symbol and object (`mvb_bf16_k<K>_c<KC>_m<M>_r<R>`, `mvb_...o`): the GEMV step with b[rows] after x; its
numpy model and cost are the GEMV's with the epilogue (kernel_builder.gemv.external); x carries the tile's
bias rows after the input vector."""
from __future__ import annotations

import functools
import re

from kernel_builder.external_costs import DEFAULT_STACK, ExternalCost
from kernel_builder.externals import ExternalFamily
from kernel_builder.gemv.external import _gemv, gemv_kernel, gemv_model

FAMILY = ExternalFamily("gemv_bias", "gemv.cc", r"mvb_k(\d+)_c(\d+)_m(\d+)_r(\d+)\.o",
                        r"mvb_bf16_k(\d+)_c(\d+)_m(\d+)_r(\d+)",
                        functools.partial(gemv_kernel, bias=True), functools.partial(gemv_model, bias=True))
COSTS = (
    # gemv_bias(w, x + b, acc, y, row, k0): writes acc and y
    ExternalCost("gemv_bias", re.compile(FAMILY.symbol_re), functools.partial(_gemv, bias=True), DEFAULT_STACK,
                 (2, 3), (3,)),
)
