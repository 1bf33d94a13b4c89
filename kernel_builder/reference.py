"""numpy reference of every kernel with NPU numerics: bf16 inputs, float32 arithmetic, one bf16
round-to-nearest-even on the output. Each kernel's is in kernel_builder/<kind>/reference.py; this is the table.

The emulator calls `KERNELS[kind](*inputs, **params)` with the inputs in the canonical argument order of
docs/architecture.md (outputs are not passed) and the params of the `llama_npu.kernel` launch attribute.
Inputs may be bf16 or float32 arrays (holding bf16-representable values), flat or 2-D; they are reshaped to the
documented shapes and never modified. These run hundreds of times per decoded token, so they avoid copies:
bf16 -> f32 conversion once, matmuls in f32.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from kernel_builder.add.reference import add
from kernel_builder.bias_add.reference import bias_add
from kernel_builder.attention.reference import (attention, attention_block_float, attention_numpy, attention_scale,
                                               decode_attn, flash_attn)
from kernel_builder.geglu.reference import geglu
from kernel_builder.gemm.reference import gemm
from kernel_builder.gemv.reference import gemv
from kernel_builder.gemv_bias.reference import gemv_bias
from kernel_builder.gemv_q4_bias.reference import gemv_q4_bias
from kernel_builder.registry import specs
from kernel_builder.rmsnorm.reference import rmsnorm
from kernel_builder.rope.reference import rope
from kernel_builder.swiglu.reference import swiglu

# kind -> reference, one per registered kernel (a dict: tests swap an entry to see the emulator use it)
KERNELS: dict[str, Callable[..., np.ndarray]] = {s.kind: s.reference for s in specs()}

__all__ = ["KERNELS", "add", "attention", "attention_block_float", "bias_add", "attention_numpy", "attention_scale", "decode_attn", "flash_attn", "geglu",
           "gemm",
           "gemv", "gemv_bias", "gemv_q4_bias", "rmsnorm", "rope", "swiglu"]
