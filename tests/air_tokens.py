"""Tokens of the MLIR-AIR text our builders and the stitcher generate, for the structure checks
(air_checks.py): the one AIR reader's lexer (kernel_builder.mlir_text.tokenize; aliases expanded here),
balanced brackets, types, attribute dictionaries and memory spaces."""
from __future__ import annotations

from dataclasses import dataclass

from kernel_builder import mlir_text as mt

_CLOSE = {"(": ")", "[": "]", "{": "}", "<": ">"}

# the reader's token kinds (kernel_builder.mlir_text) under the names these checks use
_KINDS = {"string": "str", "symbol": "sym", "label": "caret", "attr_alias": "alias", "type_alias": "alias",
          "number": "num", "ssa": "ssa", "ident": "ident", "punct": "punct"}


@dataclass
class Tok:
    kind: str
    text: str
    start: int
    end: int


def tokenize(text: str, start: int = 0, end: int | None = None, defs: dict | None = None) -> list[Tok]:
    """The reader's tokens of text[start:end] (kernel_builder.mlir_text.tokenize, whitespace and comments
    dropped; offsets into `text`), with a minus sign joined to the number it precedes, `>=` / `<=` / `==` as two
    punctuation tokens (brackets are counted token by token here) and aliases expanded (with `defs`, the
    module's alias definitions from `alias_defs`; else the definitions found in the span itself)."""
    out: list[Tok] = []
    for t in mt.tokenize(text, start, end):
        if t.kind == "op" and t.text == "->":
            out.append(Tok("arrow", t.text, t.start, t.end))
        elif t.kind == "op":
            out += [Tok("punct", t.text[0], t.start, t.start + 1), Tok("punct", "=", t.start + 1, t.end)]
        elif t.kind == "number" and out and out[-1].text == "-" and out[-1].end == t.start:
            out[-1] = Tok("num", "-" + t.text, out[-1].start, t.end)
        elif t.kind == "other" and t.text == "!":
            out.append(Tok("punct", t.text, t.start, t.end))
        elif t.kind in _KINDS:
            out.append(Tok(_KINDS[t.kind], t.text, t.start, t.end))
        else:
            raise ValueError(f"unexpected character {t.text!r} at offset {t.start}")
    return _expand_aliases(out, {} if defs is None else defs)


def alias_defs(alias_texts) -> dict[str, list[Tok]]:
    """`#name = ...` / `!name = ...` definitions (the reader's AliasDef texts, in order) -> their tokens."""
    defs: dict[str, list[Tok]] = {}
    for a in alias_texts:
        tokenize(a, defs=defs)   # records the definition in defs
    return defs


def _expand_aliases(toks: list[Tok], defs: dict[str, list[Tok]]) -> list[Tok]:
    """Drop `#name = ...` / `!name = ...` definitions (recorded in `defs`) and replace every use by the defining
    tokens (spans of the use), so types compare by what they mean, not by how they are spelled."""
    out: list[Tok] = []
    i = 0
    while i < len(toks):
        t = toks[i]
        if t.kind == "alias" and i + 1 < len(toks) and toks[i + 1].text == "=":
            j = i + 2
            if j + 1 < len(toks) and toks[j].kind == "ident" and toks[j + 1].text == "<":
                end = matching(toks, j + 1) + 1
            else:
                end = j + 1
            defs[t.text] = [d for tok in toks[j:end] for d in defs.get(tok.text, [tok])]
            i = end
            continue
        if t.kind == "alias" and t.text in defs:
            out += [Tok(d.kind, d.text, t.start, t.end) for d in defs[t.text]]
        else:
            out.append(t)
        i += 1
    return out


def matching(toks: list[Tok], i: int) -> int:
    """Index of the bracket closing toks[i] (one of ( [ { <)."""
    open_, close = toks[i].text, _CLOSE[toks[i].text]
    depth = 0
    for j in range(i, len(toks)):
        t = toks[j].text
        if t == open_:
            depth += 1
        elif t == close:
            depth -= 1
            if depth == 0:
                return j
    raise ValueError(f"unbalanced {open_!r} at offset {toks[i].start}")


def norm_type(toks: list[Tok]) -> str:
    return "".join(t.text for t in toks)


def parse_type(toks: list[Tok], i: int) -> tuple[str, int]:
    """A type starting at toks[i]; returns (normalized text, index after it)."""
    if toks[i].kind == "ident" and i + 1 < len(toks) and toks[i + 1].text == "<":
        j = matching(toks, i + 1)
        return norm_type(toks[i:j + 1]), j + 1
    if toks[i].text == "(":  # function type
        j = matching(toks, i)
        k = j + 1
        if k < len(toks) and toks[k].kind == "arrow":
            if toks[k + 1].text == "(":
                k = matching(toks, k + 1) + 1
            else:
                _, k = parse_type(toks, k + 1)
        return norm_type(toks[i:k]), k
    return toks[i].text, i + 1


def parse_type_list(toks: list[Tok], i: int, stop: tuple[str, ...]) -> tuple[list[str], int]:
    types = []
    while True:
        ty, i = parse_type(toks, i)
        types.append(ty)
        if i < len(toks) and toks[i].text == ",":
            i += 1
            continue
        return types, i


def parse_attr_value(toks: list[Tok], i: int):
    t = toks[i]
    if t.text == "{":
        return parse_attr_dict(toks, i)
    if t.kind == "str":
        return t.text[1:-1], i + 1
    if t.kind == "num":
        val = float(t.text) if any(c in t.text for c in ".eE") else int(t.text)
        i += 1
        if i < len(toks) and toks[i].text == ":":
            ty, i = parse_type(toks, i + 1)
            if ty.startswith("f") or ty == "bf16":
                val = float(val)
        return val, i
    if t.text in ("[", "(", "<"):
        j = matching(toks, i)
        return norm_type(toks[i:j + 1]), j + 1
    if t.kind == "ident":
        if i + 1 < len(toks) and toks[i + 1].text == "<":
            j = matching(toks, i + 1)
            return norm_type(toks[i:j + 1]), j + 1
        return {"true": True, "false": False}.get(t.text, t.text), i + 1
    return t.text, i + 1


def parse_attr_dict(toks: list[Tok], i: int) -> tuple[dict, int]:
    assert toks[i].text == "{"
    out, i = {}, i + 1
    while toks[i].text != "}":
        key = toks[i].text.strip('"')
        i += 1
        if toks[i].text == "=":
            out[key], i = parse_attr_value(toks, i + 1)
        else:
            out[key] = True  # unit attribute
        if toks[i].text == ",":
            i += 1
    return out, i + 1


def memory_space(ty: str) -> str | None:
    """'' for no memory space, '1:i32' style otherwise, None for non-memref types. A layout
    (`strided<...>`, `affine_map<...>`) is not a memory space."""
    if not (ty.startswith("memref<") and ty.endswith(">")):
        return None
    parts, depth, cur = [], 0, ""
    for ch in ty[len("memref<"):-1].replace("->", "=:"):   # an affine map's arrow is not a bracket
        depth += ch in "<([{"
        depth -= ch in ">)]}"
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    parts.append(cur)
    spaces = [p for p in parts[1:] if not p.startswith(("strided<", "affine_map<", "("))]
    return spaces[0] if spaces else ""
