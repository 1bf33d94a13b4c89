"""Greedy decode in ONE dispatch per token (llama_npu.models.token): the host passes the token id and its
position (the id moves the embedding window's address; the position is a 4-byte scalar) and reads the best id
with its logit (8 bytes); the embedding row, every layer, the LM head and the argmax run in one module on the
device. Each window's module is built when the engine first decodes in that window (`build`; `llama-npu compile`
builds them all ahead).

The engine uses it when the next token is the argmax of the raw logits (greedy sampling, no logits processors,
no logprobs, no logits callback) and the model has an on-device form (models.token.unsupported); otherwise it
runs the per-layer decode and reads the logits.
"""
from __future__ import annotations

import numpy as np

from kernel_builder.numerics import BF16
from kernel_builder.topk.reference import candidates, empty

from .models.graph import POS
from .models.token import CAND_INIT, EMBED, NEXT, TOKEN, token_module, unsupported

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


def token_decls(model, windows, enabled: bool = True) -> list:
    """The token modules of these KV windows (none when the model has no on-device form or not enabled)."""
    if not enabled or unsupported(model):
        return []
    return [token_module(model, w) for w in windows]


class TokenDecoder:
    """Runs the `token_kv<W>` modules of one ModuleExecutor (`decls`: window -> ModuleDecl)."""

    def __init__(self, cache, decls: dict, vocab: int, build=None):
        self.cache, self.decls, self.vocab = cache, decls, vocab
        self.build = build      # decl -> Artifact: a window's module built on its first use (Engine.load)
        self.k = decls[min(decls)].arg(CAND_INIT).shape[1] // 2

    def preload(self, embed) -> None:
        """An untied model's embedding rows into the `embed` state (the rows the host gathered before: `embed[ids]`
        bf16; a tied model's are the VOCAB state's, written with the LM head) and the chain's empty candidates
        into each module's static."""
        c = self.cache
        untied = any(EMBED in d.states() for d in self.decls.values())
        if untied:
            c.define_state(EMBED, self.vocab, per_key=False)
        for r0 in range(0, self.vocab if untied else 0, EMBED_WRITE_BATCH):
            rows = np.arange(r0, min(self.vocab, r0 + EMBED_WRITE_BATCH))
            c.write_state(EMBED, np.ascontiguousarray(np.asarray(embed[rows], dtype=BF16)), start=r0)
        for d in self.decls.values():
            c.write_static(d.name, bo_key=d.name, **{CAND_INIT: empty(self.k)})

    def step(self, token: int, pos: int, window: int) -> int:
        """Feed `token` at `pos` (KV window `window`): the argmax of the next token's logits."""
        d = self.decls[window]
        if d.name not in self.cache.artifacts and self.build is not None:
            self.cache.artifacts[d.name] = self.build(d)
        out = self.cache.load_and_run(d.name, bo_key=d.name, read=(NEXT,), **{POS: pos, TOKEN: int(token)})
        ids, _ = candidates(out[NEXT])
        return int(ids[0])
