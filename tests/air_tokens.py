"""Tokens of the MLIR-AIR text our builders and the stitcher generate, for the structure checks
(air_checks.py): a small tokenizer (aliases expanded), balanced brackets, types, attribute dictionaries and
memory spaces."""
from __future__ import annotations

import re
from dataclasses import dataclass

_TOKEN = re.compile(r"""
    (?P<str>"(?:[^"\\]|\\.)*")
  | (?P<ssa>%[A-Za-z0-9_$.\-]+(?:\#\d+)?)
  | (?P<sym>@[A-Za-z0-9_$.\-]+)
  | (?P<caret>\^[A-Za-z0-9_$.\-]+)
  | (?P<alias>[\#!][A-Za-z_][A-Za-z0-9_$.\-]*)
  | (?P<num>-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?)
  | (?P<ident>[A-Za-z_][A-Za-z0-9_$.]*)
  | (?P<arrow>->)
  | (?P<punct>[(){}\[\]<>,:=*?+!])
  | (?P<ws>\s+)
  | (?P<comment>//[^\n]*)
""", re.X)

_CLOSE = {"(": ")", "[": "]", "{": "}", "<": ">"}


@dataclass
class Tok:
    kind: str
    text: str
    start: int
    end: int


def tokenize(text: str) -> list[Tok]:
    out, pos = [], 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if not m:
            raise ValueError(f"unexpected character {text[pos]!r} at offset {pos}")
        kind = m.lastgroup
        if kind not in ("ws", "comment"):
            out.append(Tok(kind, m.group(), m.start(), m.end()))
        pos = m.end()
    return _expand_aliases(out)


def _expand_aliases(toks: list[Tok]) -> list[Tok]:
    """Drop `#name = ...` / `!name = ...` definitions and replace every use by the defining tokens
    (spans of the use), so types compare by what they mean, not by how they are spelled."""
    defs: dict[str, list[Tok]] = {}
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


def is_attr_dict(toks: list[Tok], i: int) -> bool:
    nxt = toks[i + 1] if i + 1 < len(toks) else None
    if nxt is None or nxt.text == "}":
        return True
    after = toks[i + 2].text if i + 2 < len(toks) else ""
    return nxt.kind in ("ident", "str") and after in ("=", ",", "}")


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
