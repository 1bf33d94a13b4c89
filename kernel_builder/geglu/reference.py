"""numpy reference of the `geglu` kernel with NPU numerics (kernel_builder.reference has the contract: bf16
inputs, f32 arithmetic, one bf16 round-to-nearest-even on the output)."""
from __future__ import annotations

import math

import numpy as np

from kernel_builder.numerics import F32, check_dims, f32_input, to_bf16

GELU_C = F32(math.sqrt(2.0 / math.pi))    # the tanh approximation's constants (PyTorch gelu(approximate="tanh"))
GELU_A = F32(0.044715)


def gelu_tanh(g: np.ndarray) -> np.ndarray:
    """0.5 * g * (1 + tanh(z)), z = sqrt(2/pi) * (g + 0.044715 g^3), in f32 as g / (1 + exp(-2z)) (the same
    function: 0.5 (1 + tanh z) = sigmoid(2z)), which has no cancellation where tanh(z) nears -1: the tanh form's
    1 + tanh(z) keeps no significant bit below g ~ -5 (and its value there depends on the libm's tanh)."""
    return g / (F32(1.0) + np.exp(F32(-2.0) * GELU_C * (g + GELU_A * g * g * g)))


def geglu(gate, up, *, rows: int, dim: int) -> np.ndarray:
    """y = gelu_tanh(gate) * up."""
    check_dims("geglu", rows=rows, dim=dim)
    g = f32_input("geglu", "gate", gate, (rows, dim))
    u = f32_input("geglu", "up", up, (rows, dim))
    with np.errstate(over="ignore"):   # exp -> inf for very negative g: g / inf = -0, as intended
        return to_bf16(gelu_tanh(g) * u)
