"""The comparison behind the choice of the grammar engine (docs/serve.md, "Structured output"): llguidance,
xgrammar and outlines-core on the embedded SmolLM2 tokenizer (vocabulary 49152), over JSON schemas of
growing size and feature use: does the schema compile, does the engine accept a valid instance token by
token, compile time, and the per-token mask cost along that instance.

    .venv/bin/pip install llguidance xgrammar outlines-core   # only llguidance is a dependency
    .venv/bin/python -m benchmarks.constraint_engines

An engine that is not installed is skipped. Not part of `make bench` (which measures the chosen one in
benchmarks/constrained.py).
"""
from __future__ import annotations

import json
import statistics
import time

SCHEMAS = {  # name: (schema, a valid instance)
    "flat": ({"type": "object", "properties": {"city": {"type": "string"},
                                                "unit": {"enum": ["celsius", "fahrenheit"]}},
              "required": ["city", "unit"], "additionalProperties": False},
             {"city": "Paris", "unit": "celsius"}),
    "nested": ({"type": "object", "properties": {
        "name": {"type": "string"}, "age": {"type": "integer"},
        "address": {"type": "object", "properties": {"street": {"type": "string"}, "zip": {"type": "string"}},
                    "required": ["street", "zip"], "additionalProperties": False},
        "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}},
        "pets": {"type": "array", "items": {"type": "object", "properties": {
            "kind": {"enum": ["cat", "dog"]}, "weight": {"type": "number"}},
            "required": ["kind", "weight"], "additionalProperties": False}}},
        "required": ["name", "age", "address", "tags", "pets"], "additionalProperties": False},
        {"name": "Ada", "age": 36, "address": {"street": "1 Main St", "zip": "12345"}, "tags": ["a", "c"],
         "pets": [{"kind": "cat", "weight": 4.5}, {"kind": "dog", "weight": 12}]}),
    "refs+anyOf": ({"$defs": {"pt": {"type": "object", "properties": {"x": {"type": "number"},
                                                                      "y": {"type": "number"}},
                                     "required": ["x", "y"], "additionalProperties": False}},
                    "type": "object", "properties": {
                        "shape": {"anyOf": [{"type": "object", "properties": {"center": {"$ref": "#/$defs/pt"},
                                                                              "r": {"type": "number"}},
                                             "required": ["center", "r"], "additionalProperties": False},
                                            {"type": "array", "items": {"$ref": "#/$defs/pt"}}]},
                        "label": {"type": ["string", "null"]}},
                    "required": ["shape", "label"], "additionalProperties": False},
                   {"shape": [{"x": 1, "y": 2}, {"x": 3.5, "y": -1}], "label": None}),
    "constraints": ({"type": "object", "properties": {
        "code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{2}$"},
        "n": {"type": "integer", "minimum": 1, "maximum": 99},
        "words": {"type": "array", "items": {"type": "string", "maxLength": 8}, "minItems": 1, "maxItems": 3}},
        "required": ["code", "n", "words"], "additionalProperties": False},
        {"code": "ABC-12", "n": 42, "words": ["hi", "there"]}),
    "recursive": ({"$defs": {"node": {"type": "object", "properties": {
        "v": {"type": "integer"}, "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
        "required": ["v", "kids"], "additionalProperties": False}}, "$ref": "#/$defs/node"},
        {"v": 1, "kids": [{"v": 2, "kids": []}, {"v": 3, "kids": [{"v": 4, "kids": [{"v": 5, "kids": [
            {"v": 6, "kids": [{"v": 7, "kids": [{"v": 8, "kids": []}]}]}]}]}]}]}),  # depth 7
    "free dict": ({"type": "object", "additionalProperties": {"type": "integer"}},
                  {"apples": 3, "pears": 7}),
}


def _bytes_of_tokens(tok) -> list[bytes]:
    """Each token's bytes (GPT-2 byte-level BPE: printable stand-ins for bytes)."""
    table = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    chars, n = table[:], 0
    for b in range(256):
        if b not in table:
            table.append(b)
            chars.append(256 + n)
            n += 1
    decoder = {chr(c): b for b, c in zip(table, chars)}
    vocab = tok.get_vocab(with_added_tokens=True)
    out = [b""] * len(vocab)
    for s, i in vocab.items():
        out[i] = bytes(decoder.get(ch, 0) for ch in s) if all(ch in decoder for ch in s) else s.encode()
    return out


class LLG:
    name = "llguidance"

    def __init__(self, tok_json: str, eos: int):
        import llguidance

        self.lib = llguidance
        self.tok = llguidance.LLTokenizer(tok_json, eos_token=eos)

    def compile(self, schema):
        m = self.lib.LLMatcher(self.tok, self.lib.LLMatcher.grammar_from_json_schema(schema))
        if m.is_error():
            raise ValueError(m.get_error())
        return m

    def step(self, m, token: int) -> None:
        m.compute_bitmask()
        if not m.consume_token(token):
            raise ValueError(m.get_error())


class XGR:
    name = "xgrammar"

    def __init__(self, model_dir: str, vocab: int):
        import xgrammar
        from transformers import AutoTokenizer

        self.lib = xgrammar
        info = xgrammar.TokenizerInfo.from_huggingface(AutoTokenizer.from_pretrained(model_dir), vocab_size=vocab)
        self.compiler = xgrammar.GrammarCompiler(info)
        self.mask = xgrammar.allocate_token_bitmask(1, vocab)

    def compile(self, schema):
        return self.lib.GrammarMatcher(self.compiler.compile_json_schema(json.dumps(schema), strict_mode=True))

    def step(self, m, token: int) -> None:
        m.fill_next_token_bitmask(self.mask)
        if not m.accept_token(token):
            raise ValueError("token rejected")


class OC:
    name = "outlines-core"

    def __init__(self, tok, eos: int):
        import numpy as np
        import outlines_core

        self.lib = outlines_core
        m: dict = {}
        for i, b in enumerate(_bytes_of_tokens(tok)):
            if i != eos:
                m.setdefault(b, []).append(i)
        self.vocab = outlines_core.Vocabulary(eos, m)
        self.mask = np.zeros((tok.get_vocab_size() + 31) // 32, dtype=np.int32)

    def compile(self, schema):
        from outlines_core.json_schema import build_regex_from_schema

        return self.lib.Guide(self.lib.Index(build_regex_from_schema(json.dumps(schema)), self.vocab))

    def step(self, g, token: int) -> None:
        g.write_mask_into(self.mask.ctypes.data, self.mask.size, 4)
        g.advance(token)


def run(engine, tok, schema, instance) -> str:
    t0 = time.perf_counter()
    try:
        m = engine.compile(schema)
    except Exception as e:  # noqa: BLE001 - an engine's refusal is the result
        return f"compile error: {str(e).splitlines()[0][:70]}"
    t_compile = time.perf_counter() - t0
    ids = tok.encode(json.dumps(instance, separators=(",", ":")), add_special_tokens=False).ids
    times = []
    try:
        for t in ids:
            t1 = time.perf_counter()
            engine.step(m, t)
            times.append(time.perf_counter() - t1)
    except Exception as e:  # noqa: BLE001
        return f"rejected the valid instance at token {len(times)}: {str(e).splitlines()[0][:60]}"
    return (f"compile {t_compile * 1e3:7.1f} ms, mask+advance median {statistics.median(times) * 1e6:6.0f} us, "
            f"max {max(times) * 1e6:6.0f} us over {len(ids)} tokens")


def main() -> None:
    from tokenizers import Tokenizer

    from llama_npu.model_source import resolve_model

    model_dir = resolve_model(None, progress=False)
    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    eos = tok.token_to_id("<|im_end|>")
    vocab = tok.get_vocab_size()
    engines = []
    for make in (lambda: LLG(tok.to_str(), eos), lambda: XGR(str(model_dir), vocab), lambda: OC(tok, eos)):
        t0 = time.perf_counter()
        try:
            e = make()
        except ImportError as err:
            print(f"skipped: {err}")
            continue
        print(f"{e.name}: tokenizer setup {time.perf_counter() - t0:.2f} s (vocabulary {vocab})")
        engines.append(e)
    for name, (schema, instance) in SCHEMAS.items():
        print(f"schema {name!r} ({len(json.dumps(schema))} bytes):")
        for e in engines:
            print(f"  {e.name:14s} {run(e, tok, schema, instance)}")


if __name__ == "__main__":
    main()
