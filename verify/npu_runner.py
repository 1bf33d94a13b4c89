"""Our side of the comparison: a thin adapter over llama_npu.engine.Engine.

It calls exactly what `make run` calls (Engine.load, Engine.generate with the greedy sampler, Engine.prefill)
and only *observes* logits through the on_logits callback: there is no second decode loop here, so any
change to the production prefill/decode path is what `make verify` measures.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from .gate import Trace, greedy_token, topk_ids


class OurRuntime:
    def __init__(self, engine, model_dir: Path):
        self.engine = engine
        self.model_dir = Path(model_dir)

    @classmethod
    def load(cls, model: str | None = None, device: str = "auto", buckets=None, cache_dir=None,
             progress: bool = True, weights: str = "bf16", kv: str = "bf16") -> "OurRuntime":
        from llama_npu.engine import Engine
        from llama_npu.model_source import resolve_model

        kwargs = dict(model=model, device=device, cache_dir=cache_dir, progress=progress, weights_mode=weights,
                      kv=kv)
        if buckets is not None:
            kwargs["buckets"] = buckets
        engine = Engine.load(**kwargs)
        # The same directory the engine loaded, so HF compares against the very same checkpoint.
        return cls(engine, resolve_model(model))

    @property
    def tokenizer(self):
        return self.engine.tokenizer

    @property
    def eos_ids(self) -> tuple[int, ...]:
        """The ids the engine stops on (config + tokenizer end-of-turn ids); HF stops on the same set."""
        return tuple(sorted(int(e) for e in self.engine.stop_ids))

    @property
    def device_name(self) -> str:
        dev = self.engine.cache.device
        return str(getattr(dev, "name", dev))

    def greedy(self, token_ids: list[int], n_tokens: int, k: int) -> Trace:
        """Greedy-generate through the production path; top-k ids per step come from on_logits."""
        rows: list[tuple[int, int, tuple[int, ...], bool]] = []

        def on_logits(step: int, logits) -> None:
            x = np.asarray(logits, dtype=np.float32)
            rows.append((int(step), greedy_token(x), topk_ids(x, k), bool(np.isfinite(x).all())))

        self.engine.reset()
        result = self.engine.generate(list(token_ids), max_new_tokens=n_tokens, sampler=None,
                                      on_logits=on_logits)
        steps = [r[0] for r in rows]
        if steps != list(range(len(rows))):
            raise RuntimeError(f"engine reported logits for steps {steps}; expected 0..{len(rows) - 1} in order")

        tokens = [int(t) for t in result.tokens]  # includes the EOS it stopped on, as the gate wants
        eos = set(self.eos_ids)
        if len(rows) != len(tokens):
            raise RuntimeError(f"engine returned {len(tokens)} tokens but reported logits for {len(rows)} steps")
        # The engine's own greedy choice is what it fed forward; it must agree with ours (same tie rule).
        disagree = [s for s, (t, r) in enumerate(zip(tokens, rows)) if t != r[1]]
        extra = {"text": getattr(result, "text", None)}
        if disagree:
            extra["engine_vs_argmax_disagree_at"] = disagree
        stop = "eos" if tokens and tokens[-1] in eos else "length"
        return Trace(tokens, [r[2] for r in rows], stop=stop, finite=all(r[3] for r in rows), extra=extra)

    def layer_outputs(self, token_ids: list[int]) -> list[np.ndarray]:
        """Prefill once and return each decoder layer's output, f32 [prompt_len, hidden]."""
        self.engine.reset()
        res = self.engine.prefill(list(token_ids), return_hidden=True)
        if res.hidden is None:
            raise RuntimeError("engine.prefill(return_hidden=True) returned no hidden states")
        n = len(token_ids)
        return [np.asarray(h, dtype=np.float32)[:n] for h in res.hidden]
