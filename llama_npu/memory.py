"""How much memory a model run holds: device buffers from the module declarations plus the KV cache.

Follows the KernelCache's sharing rules (docs/cache.md, "Buffer sharing"): a static buffer belongs to
(module family, bo_key, arg name, shape, dtype), so a layer's weights are counted once however many
prefill buckets share them, and input/intermediate/output buffers belong to the module, once for all
its bo_keys. The bo_keys are the Engine's: one per layer, and one for the LM head.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from multi_launch_builder import registry
from multi_launch_builder.decl import Role
from multi_launch_builder.shapes import ModelShapes

LM_HEAD = "lm_head_gemv"   # the Engine writes and runs it under this one bo_key
BF16_BYTES = 2


@dataclass(frozen=True)
class MemoryPlan:
    weights_bytes: int      # every static device buffer: layer weights, prefill RoPE LUTs, LM-head parts
    kv_cache_bytes: int     # K and V, bf16, `context` positions of every layer
    activation_bytes: int   # input / intermediate / output device buffers, one set per module

    @property
    def total(self) -> int:
        return self.weights_bytes + self.kv_cache_bytes + self.activation_bytes


def plan_memory(cfg_or_shapes, buckets: Iterable[int], context: int) -> MemoryPlan:
    """Bytes a run of this model needs with these prefill buckets and a KV cache of `context` positions.

    `cfg_or_shapes` is a ModelConfig (its buckets are filtered to the model's context, as Engine.load
    does) or bare ModelShapes (buckets used as given)."""
    from .engine import _bo, select_buckets

    if isinstance(cfg_or_shapes, ModelShapes):
        shapes, bs = cfg_or_shapes, tuple(sorted({int(b) for b in buckets}))
    else:
        shapes, bs = cfg_or_shapes.shapes, select_buckets(buckets, cfg_or_shapes.max_position)
    if isinstance(context, bool) or not isinstance(context, int) or context <= 0:
        raise ValueError(f"context must be a positive number of positions, got {context!r}")
    if not bs or min(bs) <= 0:
        raise ValueError(f"prefill buckets must be positive integers, got {list(buckets)}")
    statics: dict[tuple, int] = {}
    activations = 0
    for decl in registry.all_modules(shapes, bs):
        bo_keys = [LM_HEAD] if decl.name == LM_HEAD else [_bo(decl.name, i) for i in range(shapes.n_layers)]
        for a in decl.args:
            if a.role is Role.STATIC:
                for k in bo_keys:
                    statics[(decl.static_group, k, a.name, a.shape, a.dtype)] = a.nbytes
            else:
                activations += a.nbytes
    kv = 2 * shapes.n_layers * shapes.n_kv_heads * context * shapes.head_dim * BF16_BYTES
    return MemoryPlan(sum(statics.values()), kv, activations)
