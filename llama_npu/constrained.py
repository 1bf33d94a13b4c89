"""Grammar-constrained decoding with llguidance: JSON schemas (`response_format`), free JSON (`json_object`)
and the tool-call grammars of tool_calls.py compiled into an LLMatcher; each step the matcher's token
bitmask is applied to the logits on the host (numpy, vectorised) before sampling.

Why llguidance (numbers in docs/serve.md, "Structured output"; benchmarks/constraint_engines.py): no
dependency of its own (xgrammar needs torch, transformers and triton), compiles a schema in ~1-5 ms
(outlines-core: 50-500 ms, a regex per schema), covers recursive schemas, `$ref`, `anyOf` and string
patterns, embeds JSON schemas in Lark grammars (tool-call syntaxes) and names what it cannot do.
"""
from __future__ import annotations

import json

import numpy as np

from .errors import LlamaNpuError

# JSON as json.dumps writes it (the text the models saw most), no free whitespace: a small model given
# free whitespace may emit newlines until max_tokens.
JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


class GrammarError(LlamaNpuError):
    """A schema or grammar the engine cannot compile (the message names the problem)."""


def check_schema(schema, what: str = "schema") -> None:
    """A JSON schema that is not valid against its meta-schema: GrammarError naming the problem."""
    from jsonschema import exceptions, validators

    if not isinstance(schema, dict):
        raise GrammarError(f"{what} must be a JSON object, got {json.dumps(schema)[:60]}")
    try:
        validators.validator_for(schema).check_schema(schema)
    except exceptions.SchemaError as e:
        where = "/".join(str(p) for p in e.absolute_path) or "(root)"
        raise GrammarError(f"{what} is not a valid JSON schema at {where}: {e.message}") from None


def schema_lark(schema: dict) -> str:
    """A Lark fragment matching JSON text valid against `schema` (llguidance's %json, without free whitespace)."""
    s = dict(schema)
    s["x-guidance"] = {**JSON_OPTIONS, **(s.get("x-guidance") or {})}
    return "%json" + json.dumps(s)


def lark_string(text: str) -> str:
    """A Lark string literal matching `text` exactly."""
    return json.dumps(text)


class GrammarEngine:
    """llguidance's view of one tokenizer (built once: ~1 s), and the compiler of grammars for it."""

    def __init__(self, tokenizer_json: str, stop_ids, vocab: int):
        import llguidance

        self._llg = llguidance
        self.vocab = vocab  # the logits' length (may exceed the tokenizer's: padded LM heads)
        self.tok = llguidance.LLTokenizer(tokenizer_json, n_vocab=vocab, eos_token=sorted(stop_ids))

    @classmethod
    def for_tokenizer(cls, tokenizer, stop_ids, vocab: int) -> "GrammarEngine":
        return cls(tokenizer._tok.to_str(), stop_ids, vocab)

    def token_bytes(self, token: int) -> bytes:
        return self.tok.decode_bytes([int(token)])

    def _matcher(self, grammar: str):
        m = self._llg.LLMatcher(self.tok, grammar, log_level=0)
        if m.is_error():
            lines = [ln.strip() for ln in m.get_error().splitlines()]  # one line; regex carets dropped
            raise GrammarError(" ".join(ln for ln in lines if ln and set(ln) != {"^"}))
        return m

    def json_schema(self, schema: dict, what: str = "schema") -> "Constraint":
        check_schema(schema, what)
        try:
            grammar = self._llg.LLMatcher.grammar_from_json_schema(schema, defaults=JSON_OPTIONS)
            return Constraint(self._matcher(grammar), self.vocab)
        except (GrammarError, ValueError) as e:
            raise GrammarError(f"{what} is not supported: {e}") from None

    def json_object(self) -> "Constraint":
        return self.json_schema({"type": "object"})

    def lark(self, lark: str, what: str = "grammar") -> "Constraint":
        try:
            return Constraint(self._matcher(self._llg.LLMatcher.grammar_from_lark(lark)), self.vocab)
        except GrammarError as e:
            raise GrammarError(f"{what} is not supported: {e}") from None


class Constraint:
    """A logits processor (mlx-lm's shape: `(tokens, logits) -> logits`): feeds the matcher the tokens
    generated since the last call, then sets every token the grammar forbids to -inf. Once the grammar
    is complete only the end-of-turn tokens are allowed."""

    def __init__(self, matcher, vocab: int):
        self.matcher = matcher
        self.vocab = vocab
        self.fed = 0
        self._mask = np.zeros((vocab + 31) // 32, dtype=np.int32)

    def __call__(self, tokens: list[int], logits: np.ndarray) -> np.ndarray:
        m = self.matcher
        for t in tokens[self.fed:]:
            if not m.consume_token(int(t)):
                raise GrammarError(f"the constraint rejected token {t}: {m.get_error()}")
        self.fed = len(tokens)
        m.unsafe_compute_mask_ptr(self._mask.ctypes.data, self._mask.nbytes)
        allowed = np.unpackbits(self._mask.view(np.uint8), bitorder="little")[: logits.shape[-1]]
        return np.where(allowed.astype(bool), logits, np.float32(-np.inf)).astype(np.float32, copy=False)

    @property
    def accepting(self) -> bool:
        return self.matcher.is_accepting()


class Triggered:
    """A constraint that starts when the generated text shows `trigger` and ends when its grammar is complete
    (tool_choice "auto": the model opens a call in its syntax, the call grammar takes over until the call is
    closed, then the model writes freely again and may open another). Before the trigger: no cost but a
    short decode of the last few tokens per step."""

    WINDOW = 16  # tokens decoded to look for the trigger

    def __init__(self, make: "callable", trigger: str, decode, encode):
        self.make, self.trigger, self.decode, self.encode = make, trigger, decode, encode
        self.active: Constraint | None = None
        self.start = 0      # the trigger is looked for in tokens[start:] (after the last closed call)
        self.offset = 0     # tokens[offset:] are what the active constraint has been fed

    def __call__(self, tokens: list[int], logits: np.ndarray) -> np.ndarray:
        if self.active is None and not self._arm(tokens):
            return logits
        c = self.active
        for t in tokens[self.offset + c.fed:]:
            if not c.matcher.consume_token(int(t)):
                self.active, self.start = None, len(tokens)
                return logits
        c.fed = len(tokens) - self.offset
        if c.matcher.is_stopped():  # the call is closed: free text again
            self.active, self.start = None, len(tokens)
            return logits
        return c(tokens[self.offset:], logits)

    def _arm(self, tokens: list[int]) -> bool:
        window = tokens[max(self.start, len(tokens) - self.WINDOW):]
        text = self.decode(window) if window else ""
        i = text.find(self.trigger)
        if i < 0:
            return False
        c = self.make()
        for t in self.encode(text[i + len(self.trigger):]):  # the rest of the token that completed the trigger
            if not c.matcher.consume_token(int(t)):
                self.start = len(tokens)
                return False
        self.active, self.offset, c.fed = c, len(tokens), 0
        return True
