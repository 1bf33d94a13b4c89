"""The device states a model's layer graphs declare, defined generically: every state of every layer variant's
graph (`LayerGraph.states`) gets one buffer per layer (the KV cache), except the RoPE tables the model names
(`rope_tables`), which are one shared buffer written once from the host. All grow together, by whole KV
windows, never beyond the run's context and never silently truncated."""
from __future__ import annotations

from .errors import PromptError
from .rope import RopeTable


class DeviceStates:
    def __init__(self, cache, model, cfg, context: int):
        s = cfg.shapes
        self.cache, self.context, self.max_position = cache, context, cfg.max_position
        self.windows = model.kv_windows(context)        # KV-cache windows attention is built for
        self.ropes = {name: RopeTable(s.head_dim, params, rotary_dim=s.rotary_dim)
                      for name, params in model.rope_tables(cfg).items()}   # every RoPE table state
        names = dict.fromkeys(n for v in model.layer_variants for n in model.layer_graph(v).states)
        self.per_layer = tuple(n for n in names if n not in self.ropes)
        self.capacity = 0

    def window(self, needed: int, rows: int | None = None) -> int:
        """The smallest KV window holding positions [0, needed) (a prefill chunk may also use its own size)."""
        return min(w for w in (*((rows,) if rows else ()), *self.windows) if w >= needed)

    def ensure(self, needed: int) -> None:
        """Rows for positions [0, needed): grown (contents kept) to the next window, the new RoPE rows written."""
        if needed > self.context:
            raise PromptError(f"position {needed - 1} is beyond this run's context of {self.context} tokens"
                              + (" (--context)" if self.context < self.max_position else ""))
        if needed <= self.capacity:
            return
        old = self.capacity
        cap = min(w for w in self.windows if w >= needed)   # a window: every attention module fits the cache
        for name in self.per_layer:
            self.cache.define_state(name, cap)
        for name, table in self.ropes.items():
            self.cache.define_state(name, cap, per_key=False)
            self.cache.write_state(name, table.rows(cap)[old:], start=old)
        self.capacity = cap
