"""How much memory a model run holds: device buffers from the module declarations plus the device states
(KV cache, RoPE table) for a context of `context` positions.

Follows the KernelCache's sharing rules (docs/cache.md, "Buffer sharing"): a static buffer belongs to
(module family, bo_key, arg name, shape, dtype), so a layer's weights are counted once however many
modules share them, input/intermediate/output/scalar buffers belong to the module, once for all its
bo_keys, and a state has one buffer per layer (KV cache) or one in all (RoPE table). The bo_keys are the
Engine's: one per layer, and one for the LM head.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from kernel_builder.decl import Role

from .models import FAMILIES, LlamaModel
from .models.llama import ROPE_TABLE, ModelShapes

BF16_BYTES = 2


@dataclass(frozen=True)
class MemoryPlan:
    weights_bytes: int      # every static device buffer: layer weights, final norm, LM-head partitions
    kv_cache_bytes: int     # device states: K and V of every layer + the RoPE table, `context` positions
    activation_bytes: int   # input / intermediate / output / scalar device buffers, one set per module

    @property
    def total(self) -> int:
        return self.weights_bytes + self.kv_cache_bytes + self.activation_bytes


def plan_memory(cfg_or_shapes, buckets: Iterable[int], context: int) -> MemoryPlan:
    """Bytes a run of this model needs with these prefill buckets and device states of `context` positions.

    `cfg_or_shapes` is a ModelConfig (its family's description; buckets filtered to the model's context, as
    Engine.load does) or bare ModelShapes (a Llama; buckets used as given)."""
    from .engine import layer_key, select_buckets

    if isinstance(cfg_or_shapes, ModelShapes):
        shapes, bs = cfg_or_shapes, tuple(sorted({int(b) for b in buckets}))
        model = LlamaModel(shapes)
    else:
        shapes, bs = cfg_or_shapes.shapes, select_buckets(buckets, cfg_or_shapes.max_position)
        model = FAMILIES[cfg_or_shapes.family](shapes)
    if isinstance(context, bool) or not isinstance(context, int) or context <= 0:
        raise ValueError(f"context must be a positive number of positions, got {context!r}")
    if not bs or min(bs) <= 0:
        raise ValueError(f"prefill buckets must be positive integers, got {list(buckets)}")
    statics: dict[tuple, int] = {}
    activations = 0
    head = model.head().decls[0].name
    for decl in model.modules(bs):
        bo_keys = [head] if decl.name == head else [layer_key(i) for i in range(shapes.n_layers)]
        for a in decl.args:
            if a.role is Role.STATIC:
                for k in bo_keys:
                    statics[(decl.static_group, k, a.name, a.shape, a.dtype)] = a.nbytes
            elif a.role is not Role.STATE:
                activations += a.nbytes
    states = 0
    for name, width in model.graph.states.items():
        per = 1 if name == ROPE_TABLE else shapes.n_layers
        states += per * context * width * BF16_BYTES
    return MemoryPlan(sum(statics.values()), states, activations)
