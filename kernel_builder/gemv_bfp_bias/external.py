"""The `gemv_bfp_bias` kernel's external C++ kernel: external_kernels/gemv_bfp.cc compiled with -DGBFP_BIAS=1 under
its own symbol and object (`mvbfpb_bf16_k<K>_c<KC>_m<M>_r<R>`, `mvbfpb_...o`); x carries the tile's bias rows
after the input vector. Its numpy model and cost are the block-float GEMV's with the epilogue."""
from __future__ import annotations

import functools
import re

from kernel_builder.external_costs import DEFAULT_STACK, ExternalCost
from kernel_builder.externals import ExternalFamily
from kernel_builder.gemv_bfp.external import _gemv_bfp, gemv_bfp_kernel, gemv_bfp_model

FAMILY = ExternalFamily("gemv_bfp_bias", "gemv_bfp.cc", r"mvbfpb_k(\d+)_c(\d+)_m(\d+)_r(\d+)\.o",
                        r"mvbfpb_bf16_k(\d+)_c(\d+)_m(\d+)_r(\d+)",
                        functools.partial(gemv_bfp_kernel, bias=True), functools.partial(gemv_bfp_model, bias=True))
COSTS = (
    # gemv_bfp_bias(w, x + b, acc, y, row, k0): writes acc and y
    ExternalCost("gemv_bfp_bias", re.compile(FAMILY.symbol_re), functools.partial(_gemv_bfp, bias=True),
                 DEFAULT_STACK, (2, 3), (3,)),
)
