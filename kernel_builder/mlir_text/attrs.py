"""Attribute dictionaries: `{name = value, ...}` read into Python values (unknown values kept as text)."""
from __future__ import annotations

import re
import struct

from kernel_builder.mlir_text.lexer import _OPENERS, _Cursor, first_tokens, match_bracket, split_top_level

# -------------------------------------------------------------------------------------- attributes

class RawAttr(str):
    """An attribute value kept as text (types, affine maps, dialect attributes ...)."""


def parse_attr_dict(text: str) -> dict:
    """`{a = 1, b = "s", c = 1.0e-05 : f32, d, e = {f = true}, g = [1, 2]}` -> Python dict.
    Integers -> int, floats -> float, strings -> str, true/false/unit -> bool, arrays -> list,
    dictionaries -> dict, anything else -> RawAttr(text)."""
    cur = _Cursor(text, what="attribute dictionary")
    out = _parse_dict(cur)
    if cur.peek() is not None:
        raise ValueError(f"attribute dictionary: trailing text {text[cur.pos:]!r}")
    return out


def attr_dict_entries(text: str) -> list[tuple[str, str]]:
    """`{a = 1, b = {c = 2}}` -> [("a", "a = 1"), ("b", "b = {c = 2}")]: entries verbatim, for moving
    an entry from one op to another without re-printing it."""
    text = text.strip()
    if not (text.startswith("{") and match_bracket(text, 0) == len(text)):
        raise ValueError(f"not an attribute dictionary: {text[:60]!r}")
    out = []
    for entry in split_top_level(text[1:-1]):
        if not entry:
            continue
        key = first_tokens(entry, 1)[0]
        out.append((_unescape(key.text) if key.kind == "string" else key.text, entry))
    return out


def _parse_dict(cur: _Cursor) -> dict:
    cur.expect("{")
    out: dict = {}
    while not cur.accept("}"):
        key_tok = cur.next()
        if key_tok.kind == "string":
            key = _unescape(key_tok.text)
        elif key_tok.kind == "ident":
            key = key_tok.text
        else:
            raise ValueError(f"attribute dictionary: bad key {key_tok.text!r} at offset {key_tok.start}")
        if key in out:
            raise ValueError(f"attribute dictionary: duplicate key {key!r}")
        out[key] = _parse_value(cur) if cur.accept("=") else True
        if not cur.accept(","):
            cur.expect("}")
            break
    return out


def _parse_value(cur: _Cursor):
    t = cur.peek()
    if t is None:
        raise ValueError(f"{cur.what}: missing value")
    if t.text == "{":
        return _parse_dict(cur)
    if t.text == "[":
        cur.next()
        items = []
        while not cur.accept("]"):
            items.append(_parse_value(cur))
            if not cur.accept(","):
                cur.expect("]")
                break
        return items
    if t.kind == "string":
        cur.next()
        return _unescape(t.text)
    if t.text in ("true", "false"):
        cur.next()
        return t.text == "true"
    if t.text == "unit":
        cur.next()
        return True
    if t.kind == "number" or (t.text == "-" and cur.peek(1) is not None and cur.peek(1).kind == "number"):
        neg = cur.accept("-") is not None
        num = cur.next().text
        type_text = None
        if cur.accept(":"):
            ts = cur.pos
            _skip_type(cur)
            type_text = cur.text[ts:cur.pos].strip() if cur.peek() else cur.text[ts:].strip()
        value = _number(num, type_text)
        return -value if neg else value
    # Anything else: keep the raw text up to the next depth-0 ',' '}' or ']'.
    start = cur.pos
    while cur.peek() is not None and cur.peek().text not in (",", "}", "]"):
        if cur.peek().text in _OPENERS:
            cur.skip_group()
        else:
            cur.next()
    return RawAttr(cur.text[start:cur.pos].strip())


def _skip_type(cur: _Cursor) -> None:
    cur.next()  # i32 / f32 / index / memref ...
    if cur.at("<"):
        cur.skip_group()


def _number(num: str, type_text: str | None):
    is_float_type = type_text is not None and re.fullmatch(r"f(16|32|64)|bf16", type_text) is not None
    if num.startswith("0x"):
        bits = int(num, 16)
        if type_text == "f32":
            return struct.unpack("<f", struct.pack("<I", bits))[0]
        if type_text == "f64":
            return struct.unpack("<d", struct.pack("<Q", bits))[0]
        return bits
    if is_float_type or any(c in num for c in ".eE"):
        return float(num)
    return int(num)


def _unescape(s: str) -> str:
    body = s[1:-1]
    return re.sub(r'\\(["\\nt]|[0-9A-Fa-f]{2})', lambda m: {"n": "\n", "t": "\t", '"': '"', "\\": "\\"}.get(
        m.group(1), chr(int(m.group(1), 16)) if len(m.group(1)) == 2 else m.group(1)), body)
