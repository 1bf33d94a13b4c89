"""Layered on top of Engine.generate_step (which yields (token, logprobs) as mlx-lm's does): what one run did
(StepInfo), text deltas for streaming (TextStream), and the timed one-call generation (generate ->
GenerationResult: time to first token, prefill and decode rates), and stop strings cut from the streamed text
(StopStrings; the server's requests use them, serve_gen.py, with tool calls layered the same way)."""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from .sampling import Sampler
from .tokenizer import Tokenizer


@dataclass
class GenerationResult:
    tokens: list[int]
    text: str
    ttft_s: float
    prefill_tok_s: float
    decode_tok_s: float
    ms_per_token: float
    stop_reason: str                     # "eos" | "length" | "interrupted"
    prompt_len: int = 0
    prompt_computed: int = 0             # prompt tokens computed by this call (the rest came from the KV cache)


@dataclass
class StepInfo:
    """What one generate_step run did (filled in as it goes)."""
    prompt_len: int = 0
    prompt_computed: int = 0             # prompt tokens computed (the rest came from the KV cache)
    t_start: float = 0.0
    t_first: float = 0.0                 # when the first token was sampled
    stop_reason: str = "length"          # "eos" | "length" | "interrupted"


class TextStream:
    """Turns the growing token list into text deltas with a constant amount of decoding per token.

    Only a short window is decoded: the tokens since the last emitted text (`read`) plus the few before
    them (`prefix`, so word-boundary spaces decode as in the full text). A window ending in U+FFFD (an
    incomplete UTF-8 sequence split across tokens) is held back until the next token completes it."""

    def __init__(self, tokenizer: Tokenizer, on_token):
        self.tokenizer, self.on_token = tokenizer, on_token
        self.prefix = self.read = 0

    def push(self, tokens: list[int]) -> None:
        if self.on_token is None:
            return
        decode = self.tokenizer.decode
        before = decode(tokens[self.prefix:self.read])
        text = decode(tokens[self.prefix:])
        delta = ""
        if len(text) > len(before) and not text.endswith("\ufffd"):
            delta = text[len(before):]
            self.prefix, self.read = self.read, len(tokens)
        self.on_token(tokens[-1], delta)


class StopStrings:
    """Cuts the streamed text at the first stop string, which is never emitted: text that could be the
    start of a stop string is held back until the next delta shows whether it is one, so a stop string
    split across two deltas does not leak."""

    def __init__(self, stops: list[str]):
        self.stops = [s for s in stops if s]
        self.held = ""
        self.hit = False

    def push(self, delta: str) -> str:
        """Text that is safe to emit now (after a hit: nothing more)."""
        if self.hit:
            return ""
        text = self.held + delta
        if not self.stops:
            self.held = ""
            return text
        cut = min((i for i in (text.find(s) for s in self.stops) if i >= 0), default=-1)
        if cut >= 0:
            self.hit, self.held = True, ""
            return text[:cut]
        keep = 0  # the longest tail of `text` that is a proper prefix of some stop string
        for s in self.stops:
            for n in range(min(len(s) - 1, len(text)), keep, -1):
                if text.endswith(s[:n]):
                    keep = n
                    break
        self.held = text[len(text) - keep:] if keep else ""
        return text[: len(text) - keep]

    def flush(self) -> str:
        """At the end of a reply without a stop string: what was held back is plain text."""
        out, self.held = ("" if self.hit else self.held), ""
        return out


def generate(eng, token_ids: Sequence[int], max_new_tokens: int, sampler: Sampler | None = None,
             on_token: Callable[[int, str], None] | None = None,
             on_logits: Callable[[int, np.ndarray], None] | None = None,
             stop_event: threading.Event | None = None, reuse_kv: bool = False) -> GenerationResult:
    """Run `eng.generate_step` to the end, streaming text deltas to `on_token`, and time it."""
    info = StepInfo()
    stream = TextStream(eng.tokenizer, on_token)
    tokens: list[int] = []
    for tok, _ in eng.generate_step(token_ids, max_new_tokens, sampler, on_logits=on_logits,
                                    stop_event=stop_event, reuse_kv=reuse_kv, info=info):
        tokens.append(tok)
        stream.push(tokens)
    t_end = time.perf_counter()
    ttft = info.t_first - info.t_start
    n_dec = len(tokens) - 1
    dec_s = t_end - info.t_first
    return GenerationResult(
        tokens=tokens, text=eng.tokenizer.decode(tokens), ttft_s=ttft,
        prefill_tok_s=info.prompt_computed / ttft if ttft > 0 else float("inf"),
        decode_tok_s=n_dec / dec_s if n_dec and dec_s > 0 else 0.0,
        ms_per_token=1e3 * dec_s / n_dec if n_dec else 0.0,
        stop_reason=info.stop_reason, prompt_len=info.prompt_len, prompt_computed=info.prompt_computed)
