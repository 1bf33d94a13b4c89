"""Greedy decode in ONE dispatch per token (llama_npu.models.token): the host passes the token id and its
position (the id moves the embedding window's address; the position is a 4-byte scalar) and reads the best id
with its logit (8 bytes); the embedding row, every layer, the LM head and the argmax run in one module on the
device. Each window's module is built when the engine first decodes in that window (`build`; `llama-npu compile`
builds them all ahead).

The engine uses it when the next token is the argmax of the raw logits (greedy sampling, no logits processors,
no logprobs, no logits callback) and the model has an on-device form (models.token.unsupported); with top-k
sampling (k <= TOPK_MAX_K) it reads the k best (id, logit) pairs (8·k bytes) and the sampler draws from them
(`sample_logits`: the same probabilities and draws as from the whole logits, unless the k-th value is tied past
the k); otherwise it runs the per-layer decode and reads the logits.
"""
from __future__ import annotations

import numpy as np

from kernel_builder.numerics import BF16
from kernel_builder.topk.reference import candidates, empty

from .models.graph import call_scalars
from .models.token import CAND_INIT, EMBED, NEXT, TOKEN, embed_q4, token_module, unsupported

EMBED_WRITE_BATCH = 3000   # embedding rows copied to the device per write at load (bounded host memory)


def write_vocab(cache, weights, head) -> None:
    """The LM head's partitions into the one VOCAB state (llama_npu.models.llama: the lm_head module's and the
    token modules' windows), each read from the checkpoint into a host buffer of one partition, then written."""
    from kernel_builder.dtypes import dtype as _dtype
    from multi_launch_builder.decl import Role

    from .models.llama import VOCAB
    wins = [a for a in head.args if a.role is Role.STATE and a.state_name == VOCAB]
    cache.define_state(VOCAB, sum(a.shape[0] for a in wins), per_key=False)
    for a in wins:
        buf = np.zeros(a.nbytes, np.uint8)
        weights.writer(a.name, None)(buf)
        dt = _dtype(a.dtype)
        cache.write_state(VOCAB, buf.view(dt.host).reshape(dt.host_shape(a.shape)), start=a.at)


def sample_logits(ids: np.ndarray, vals: np.ndarray, vocab: int) -> np.ndarray:
    """f32 logits [vocab] holding the candidates' values and -inf elsewhere: a top-k sampler (llama_npu.sampling)
    keeps exactly the candidates and computes the probabilities of the full logits (exp(-inf) = 0)."""
    out = np.full(vocab, -np.inf, np.float32)
    out[ids] = vals
    return out


def token_decls(model, windows, enabled: bool = True) -> list:
    """The token modules of these KV windows (none when the model has no on-device form or not enabled)."""
    if not enabled or unsupported(model):
        return []
    return [token_module(model, w) for w in windows]


class TokenDecoder:
    """Runs the `token_kv<W>` modules of one ModuleExecutor (`decls`: window -> ModuleDecl)."""

    def __init__(self, cache, decls: dict, vocab: int, build=None, model=None):
        self.cache, self.decls, self.vocab, self.model = cache, decls, vocab, model
        self.build = build      # decl -> Artifact: a window's module built on its first use (Engine.load)
        self.k = decls[min(decls)].arg(CAND_INIT).shape[1] // 2

    def preload(self, embed) -> None:
        """An untied model's embedding rows into the `embed` state (the rows the host gathered before: `embed[ids]`
        bf16, or with 4-bit weights their q4 rows `embed.packed(ids)`; a tied model's are the VOCAB state's, written
        with the LM head) and the chain's empty candidates
        into each module's static."""
        c = self.cache
        untied = any(EMBED in d.states() for d in self.decls.values())
        q4 = untied and embed_q4(self.model) if self.model is not None else False
        if untied:
            c.define_state(EMBED, self.vocab, per_key=False)
        for r0 in range(0, self.vocab if untied else 0, EMBED_WRITE_BATCH):
            rows = np.arange(r0, min(self.vocab, r0 + EMBED_WRITE_BATCH))
            data = embed.packed(rows).view(np.int8) if q4 else np.asarray(embed[rows], dtype=BF16)
            c.write_state(EMBED, np.ascontiguousarray(data), start=r0)
        for d in self.decls.values():
            c.write_static(d.name, bo_key=d.name, **{CAND_INIT: empty(self.k)})

    def step(self, token: int, pos: int, window: int) -> int:
        """Feed `token` at `pos` (KV window `window`): the argmax of the next token's logits."""
        ids, _ = self.candidates(token, pos, window, 1)
        return int(ids[0])

    def candidates(self, token: int, pos: int, window: int, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Feed `token` at `pos`: the k best (ids, f32 logits) of the next token, best first. The module of a
        (window, k) is declared and built on its first use (k > 1: top-k sampling)."""
        d = self.decls[window] if k == self.k else self._module(window, k)
        if d.name not in self.cache.artifacts and self.build is not None:
            self.cache.artifacts[d.name] = self.build(d)
            self.cache.write_static(d.name, bo_key=d.name, **{CAND_INIT: empty(k)})
        out = self.cache.load_and_run(d.name, bo_key=d.name, read=(NEXT,), **{**call_scalars(d, pos), TOKEN: int(token)})
        return candidates(out[NEXT])

    def _module(self, window: int, k: int):
        from .models.token import token_module_name
        name = token_module_name(window, k)
        d = self.cache.decls.get(name)
        if d is None:
            d = self.cache.decls[name] = token_module(self.model, window, k)
        return d
