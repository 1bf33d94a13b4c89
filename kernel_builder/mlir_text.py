"""A small lexer/parser for the MLIR text our kernel builders generate.

Not a general MLIR parser: it understands exactly what the stitcher and the launch-program reader need —
tokens (strings, `//` comments, SSA values, symbols, aliases), balanced brackets (`<>`, `()`, `[]`, `{}`,
respecting strings, comments, `->` and `>=`), the module layout (aliases, module-level ops, funcs), the header
of `air.launch` / `air.segment` / `air.herd` ops and attribute dictionaries. Every parser works on raw text
spans so the text it does not interpret (types, region bodies) is carried over byte for byte.

Why text and not the MLIR Python bindings: the AIR dialect is not available on this machine (nor in CI), and
custom syntax of an unregistered dialect cannot be parsed by upstream MLIR.
"""
from __future__ import annotations

import re
import struct
from dataclasses import dataclass
from typing import Callable, Iterator, NamedTuple

# ---------------------------------------------------------------------------------------------- lexer

_STRING = r'"(?:[^"\\\n]|\\.)*"'
_SSA = r"%(?:[0-9]+|[A-Za-z_$.\-][\w$.\-]*)(?:\#[0-9]+)?"
_SYMBOL = r'@(?:"(?:[^"\\\n]|\\.)*"|[A-Za-z_][\w$.]*)'
_BARE = r"[A-Za-z_][\w$.]*"

_TOKEN_RE = re.compile(
    rf"""(?P<ws>\s+)
    |(?P<comment>//[^\n]*)
    |(?P<string>{_STRING})
    |(?P<ssa>{_SSA})
    |(?P<symbol>{_SYMBOL})
    |(?P<attr_alias>\#{_BARE})
    |(?P<type_alias>!{_BARE})
    |(?P<label>\^[\w$.\-]+)
    |(?P<op>->|>=|<=|==)
    |(?P<number>0x[0-9a-fA-F]+|[0-9]+(?:\.[0-9]*)?(?:[eE][+-]?[0-9]+)?)
    |(?P<ident>{_BARE})
    |(?P<punct>[(){{}}\[\]<>,:=*?+\-])
    |(?P<other>.)""",
    re.VERBOSE | re.DOTALL,
)

# Only the tokens that can change bracket depth (plus the ones that hide brackets).
_DEPTH_RE = re.compile(rf'{_STRING}|//[^\n]*|->|>=|[(){{}}\[\]<>]|\n')
_OPENERS = {"(": ")", "[": "]", "{": "}", "<": ">"}
_CLOSERS = {")", "]", "}", ">"}

# Tokens that renaming may touch; strings and comments are matched first so their contents never change.
_RENAME_RE = re.compile(
    rf"""(?P<string>{_STRING})|(?P<comment>//[^\n]*)
    |%(?P<ssa>[0-9]+|[A-Za-z_$.\-][\w$.\-]*)(?P<ssa_res>\#[0-9]+)?
    |@(?P<symbol>"(?:[^"\\\n]|\\.)*"|[A-Za-z_][\w$.]*)
    |\#(?P<attr_alias>{_BARE})
    |!(?P<type_alias>{_BARE})""",
    re.VERBOSE,
)


class Tok(NamedTuple):
    kind: str    # ws comment string ssa symbol attr_alias type_alias label op number ident punct other
    text: str
    start: int
    end: int


def tokenize(text: str, start: int = 0, end: int | None = None, *, keep_trivia: bool = False) -> list[Tok]:
    """Tokens of text[start:end]; whitespace and comments are dropped unless keep_trivia."""
    end = len(text) if end is None else end
    out: list[Tok] = []
    for m in _TOKEN_RE.finditer(text, start, end):
        kind = m.lastgroup
        if not keep_trivia and kind in ("ws", "comment"):
            continue
        out.append(Tok(kind, m.group(), m.start(), m.end()))
    return out


def match_bracket(text: str, pos: int) -> int:
    """Index just past the bracket closing the one at text[pos] (nesting, strings, comments, `->` aware)."""
    if text[pos] not in _OPENERS:
        raise ValueError(f"expected an opening bracket at offset {pos}, found {text[pos]!r}")
    stack: list[str] = []
    for m in _DEPTH_RE.finditer(text, pos):
        t = m.group()
        if t in _OPENERS:
            stack.append(_OPENERS[t])
        elif t in _CLOSERS:
            if not stack or stack[-1] != t:
                raise ValueError(f"unbalanced {t!r} at offset {m.start()} (bracket opened at offset {pos})")
            stack.pop()
            if not stack:
                return m.end()
    raise ValueError(f"unclosed {text[pos]!r} opened at offset {pos}")


def _depth_zero_positions(text: str, wanted: str, start: int = 0, end: int | None = None) -> Iterator[int]:
    """Offsets of the characters in `wanted` that sit at bracket depth 0 (outside strings/comments)."""
    end = len(text) if end is None else end
    pat = re.compile(rf'{_STRING}|//[^\n]*|->|>=|[(){{}}\[\]<>]|[{re.escape(wanted)}]')
    stack: list[str] = []
    for m in pat.finditer(text, start, end):
        t = m.group()
        if len(t) == 1 and t in wanted and not stack:
            yield m.start()
        if t in _OPENERS:
            stack.append(_OPENERS[t])
        elif t in _CLOSERS:
            if not stack or stack[-1] != t:
                raise ValueError(f"unbalanced {t!r} at offset {m.start()}")
            stack.pop()
    if stack:
        raise ValueError(f"unclosed bracket(s) {''.join(reversed(stack))!r} missing at end of text")


def split_top_level(text: str, sep: str = ",") -> list[str]:
    """Split at depth-0 separators (commas inside `<>`, `()`, `[]`, `{}` or strings do not split)."""
    parts, last = [], 0
    for p in _depth_zero_positions(text, sep):
        parts.append(text[last:p].strip())
        last = p + 1
    tail = text[last:].strip()
    if tail or parts:
        parts.append(tail)
    return parts


def split_ops(text: str, start: int = 0, end: int | None = None, *, comments: bool = False) -> list[tuple[int, int]]:
    """Spans of the ops in a block: ops end at a newline at bracket depth 0 (how MLIR text is printed).
    Blank lines are skipped; comment-only lines too unless `comments` (then they are spans of their own)."""
    end = len(text) if end is None else end
    spans, last = [], start
    for p in list(_depth_zero_positions(text, "\n", start, end)) + [end]:
        seg = text[last:p]
        if _has_code(seg) or (comments and seg.strip()):
            s = last + (len(seg) - len(seg.lstrip()))
            spans.append((s, last + len(seg.rstrip())))
        last = p + 1
    return spans


def _has_code(seg: str) -> bool:
    # Segments are split at depth-0 newlines, so one starting with `//` is a whole comment line.
    s = seg.strip()
    return bool(s) and not s.startswith("//")


def strip_comments(text: str) -> str:
    """Remove `//` comments (strings kept intact)."""
    return "".join(t.text for t in tokenize(text, keep_trivia=True) if t.kind != "comment")


def normalize(text: str) -> str:
    """Canonical form for comparing types/declarations: comments and whitespace outside strings removed."""
    return "".join(t.text for t in tokenize(text))


# -------------------------------------------------------------------------------------------- renaming

NameMap = Callable[[str], str | None]


def rename(text: str, *, ssa: NameMap | None = None, symbol: NameMap | None = None,
           attr_alias: NameMap | None = None, type_alias: NameMap | None = None) -> str:
    """Whole-token renaming. Each callback gets the bare name (no sigil; an SSA result suffix `#N` is kept
    aside, quoted symbols are passed unquoted) and returns the new bare name or None to keep it.
    Strings and comments are never touched, so `%arg1` never matches inside `%arg10`."""

    def sub(m: re.Match) -> str:
        kind = m.lastgroup
        if kind == "ssa_res":  # lastgroup is the last *closed* group: the `#N` of `%x#N`
            kind = "ssa"
        if kind == "ssa" and ssa is not None:
            new = ssa(m.group("ssa"))
            return m.group() if new is None else "%" + new + (m.group("ssa_res") or "")
        if kind == "symbol" and symbol is not None:
            raw = m.group("symbol")
            quoted = raw.startswith('"')
            new = symbol(raw[1:-1] if quoted else raw)
            if new is None:
                return m.group()
            return "@" + (f'"{new}"' if quoted or not re.fullmatch(_BARE, new) else new)
        if kind == "attr_alias" and attr_alias is not None:
            new = attr_alias(m.group("attr_alias"))
            return m.group() if new is None else "#" + new
        if kind == "type_alias" and type_alias is not None:
            new = type_alias(m.group("type_alias"))
            return m.group() if new is None else "!" + new
        return m.group()

    return _RENAME_RE.sub(sub, text)


def names_in(text: str) -> dict[str, set[str]]:
    """Every SSA name, symbol and alias name used in text (outside strings/comments), by kind."""
    out: dict[str, set[str]] = {"ssa": set(), "symbol": set(), "attr_alias": set(), "type_alias": set()}
    for m in _RENAME_RE.finditer(text):
        kind = m.lastgroup
        if kind == "ssa_res":
            kind = "ssa"
        if kind in out:
            name = m.group(kind)
            if kind == "symbol" and name.startswith('"'):
                name = name[1:-1]
            out[kind].add(name)
    return out


# ---------------------------------------------------------------------------------- token cursor

class _Cursor:
    """Sequential, lazy reader over the tokens of one text (whitespace/comments skipped). Lazy because the
    parsers only read headers: the region of a launch is skipped with one bracket scan, never tokenized."""

    def __init__(self, text: str, start: int = 0, end: int | None = None, what: str = "text"):
        self.text = text
        self.end = len(text) if end is None else end
        self.what = what
        self._buf: list[Tok] = []
        self._restart(start)

    def _restart(self, pos: int) -> None:
        self._buf.clear()
        self._it = _TOKEN_RE.finditer(self.text, pos, self.end)

    def peek(self, k: int = 0) -> Tok | None:
        while len(self._buf) <= k:
            for m in self._it:
                if m.lastgroup not in ("ws", "comment"):
                    self._buf.append(Tok(m.lastgroup, m.group(), m.start(), m.end()))
                    break
            else:
                return None
        return self._buf[k]

    def at(self, *texts: str) -> bool:
        t = self.peek()
        return t is not None and t.text in texts

    def next(self) -> Tok:
        t = self.peek()
        if t is None:
            raise ValueError(f"{self.what}: unexpected end of text")
        self._buf.pop(0)
        return t

    def expect(self, text: str) -> Tok:
        t = self.next()
        if t.text != text:
            raise ValueError(f"{self.what}: expected {text!r}, found {t.text!r} at offset {t.start}")
        return t

    def accept(self, text: str) -> Tok | None:
        if self.at(text):
            return self.next()
        return None

    def skip_group(self) -> tuple[int, int]:
        """Consume a balanced bracket group starting at the current token; returns its span."""
        t = self.next()
        end = match_bracket(self.text, t.start)
        self._restart(end)
        return t.start, end

    @property
    def pos(self) -> int:
        t = self.peek()
        return t.start if t is not None else self.end


def first_tokens(text: str, n: int) -> list[Tok]:
    """The first n significant tokens of text (lazily lexed)."""
    cur = _Cursor(text)
    return [t for t in (cur.peek(i) for i in range(n)) if t is not None]


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


# ------------------------------------------------------------------------------------ funcs / modules

@dataclass(frozen=True)
class FuncOp:
    """One `func.func`. params: (ssa name without `%` or None for unnamed declaration params, type text)."""

    name: str
    visibility: str | None           # "private" / "public" / None
    params: tuple[tuple[str | None, str], ...]
    results: tuple[str, ...]
    attr_text: str | None            # the `{...}` after `attributes`, verbatim
    body: tuple[int, int] | None     # span of the region contents (inside the braces) in `text`
    text: str                        # the whole op text

    @property
    def is_declaration(self) -> bool:
        return self.body is None

    @property
    def body_text(self) -> str:
        return "" if self.body is None else self.text[self.body[0]:self.body[1]]

    @property
    def attributes(self) -> dict:
        return {} if self.attr_text is None else parse_attr_dict(self.attr_text)


def is_comment(op_text: str) -> bool:
    return op_text.lstrip().startswith("//")


def op_name(op_text: str) -> str:
    """The op name of one op (`%0 = air.launch ...` -> `air.launch`, `"x.y"(...)` -> `x.y`); "" for a
    comment line."""
    if is_comment(op_text):
        return ""
    cur = _Cursor(op_text, what="op")
    _skip_results(cur)
    t = cur.next()
    return _unescape(t.text) if t.kind == "string" else t.text


def _skip_results(cur: _Cursor) -> str | None:
    """Consume `%a, %b:2 =` when present; returns the results text."""
    j = 0
    while True:
        t = cur.peek(j)
        if t is None or t.kind != "ssa":
            return None
        j += 1
        if cur.peek(j) is not None and cur.peek(j).text == ":":
            j += 2
        nxt = cur.peek(j)
        if nxt is not None and nxt.text == ",":
            j += 1
            continue
        if nxt is not None and nxt.text == "=":
            start = cur.peek().start
            end = nxt.start
            for _ in range(j + 1):
                cur.next()
            return cur.text[start:end].strip()
        return None


def parse_func(op_text: str) -> FuncOp:
    """Parse one `func.func [visibility] @name(params) [-> results] [attributes {...}] [{ body }]`."""
    cur = _Cursor(op_text, what="func.func")
    cur.expect("func.func")
    vis = None
    if cur.at("private", "public", "nested"):
        vis = cur.next().text
    sym = cur.next()
    if sym.kind != "symbol":
        raise ValueError(f"func.func: expected a symbol name, found {sym.text!r}")
    name = sym.text[1:]
    if name.startswith('"'):
        name = _unescape(name)
    ps, pe = cur.skip_group()
    params = tuple(_parse_param(p) for p in split_top_level(op_text[ps + 1:pe - 1]))
    results: tuple[str, ...] = ()
    if cur.accept("->"):
        if cur.at("("):
            rs, re_ = cur.skip_group()
            results = tuple(split_top_level(op_text[rs + 1:re_ - 1]))
        else:
            ts = cur.pos
            while cur.peek() is not None and cur.peek().text not in ("attributes", "{"):
                if cur.peek().text in _OPENERS:
                    cur.skip_group()
                else:
                    cur.next()
            results = (op_text[ts:cur.pos].strip(),)
    attr_text = None
    if cur.accept("attributes"):
        a, b = cur.skip_group()
        attr_text = op_text[a:b]
    body = None
    if cur.at("{"):
        a, b = cur.skip_group()
        body = (a + 1, b - 1)
    if cur.peek() is not None:
        raise ValueError(f"func.func @{name}: unexpected text {op_text[cur.pos:cur.pos + 40]!r}")
    return FuncOp(name, vis, params, results, attr_text, body, op_text)


def _parse_param(p: str) -> tuple[str | None, str]:
    toks = tokenize(p)
    if toks and toks[0].kind == "ssa":
        if len(toks) < 3 or toks[1].text != ":":
            raise ValueError(f"func.func: bad parameter {p!r}")
        type_text = p[toks[2].start:toks[-1].end].strip()  # trailing comments excluded
        # drop a trailing argument attribute dictionary `{llvm.noalias}`
        if type_text.endswith("}"):
            opens = [pos for pos in _depth_zero_positions(type_text, "{")]
            if opens:
                type_text = type_text[:opens[-1]].strip()
        return toks[0].text[1:], type_text
    return None, p.strip()


@dataclass(frozen=True)
class AliasDef:
    sigil: str   # "#" or "!"
    name: str
    text: str    # the whole definition line(s)


@dataclass(frozen=True)
class ModuleText:
    """The parts of one MLIR file: alias definitions (before `module`) and the module's top-level ops."""

    aliases: tuple[AliasDef, ...]
    ops: tuple[str, ...]
    funcs: tuple[FuncOp, ...]      # the ops that are func.func, parsed
    others: tuple[str, ...]        # the module-level ops that are not func.func (air.channel, memref.global ...)

    def public_funcs(self) -> list[FuncOp]:
        return [f for f in self.funcs if not f.is_declaration and f.visibility != "private"]

    def the_public_func(self) -> FuncOp:
        """The module's single public func.func with a body (a kernel or stitched module has exactly one)."""
        publics = self.public_funcs()
        if len(publics) != 1:
            raise ValueError(f"expected exactly one public func.func with a body, found {[f.name for f in publics]}")
        return publics[0]

    def private_decls(self) -> list[FuncOp]:
        return [f for f in self.funcs if f.is_declaration]


def parse_module(text: str) -> ModuleText:
    """Split a file into alias definitions and the top-level ops of its (single) module.
    A file without a `module` op is treated as an implicit module."""
    module_at = None
    depth = 0
    for m in _TOKEN_RE.finditer(text):  # lazily: `module` comes right after the aliases
        t = Tok(m.lastgroup, m.group(), m.start(), m.end())
        if t.kind in ("ws", "comment", "string"):
            continue
        if t.text in _OPENERS:
            depth += 1
        elif t.text in _CLOSERS:
            depth -= 1
        elif depth == 0 and t.kind == "ident" and t.text in ("module", "builtin.module"):
            module_at = t
            break
    if module_at is None:
        body_span, head_end = (0, len(text)), 0
    else:
        head_end = module_at.start
        cur = _Cursor(text, module_at.end, what="module")
        if cur.peek() is not None and cur.peek().kind == "symbol":
            cur.next()
        if cur.accept("attributes"):
            cur.skip_group()
        if not cur.at("{"):
            raise ValueError("module: expected '{' after `module`")
        a, b = cur.skip_group()
        body_span = (a + 1, b - 1)
        tail = text[b:]
        if any(t.kind not in ("ws", "comment") for t in tokenize(tail, keep_trivia=True)):
            raise ValueError(f"module: unexpected text after the module: {tail.strip()[:60]!r}")
    aliases = []
    pre_ops = [text[s:e] for s, e in split_ops(text, 0, head_end)] if module_at is not None else []
    module_ops = [text[s:e] for s, e in split_ops(text, *body_span)]
    for op in pre_ops:
        aliases.append(_parse_alias(op))
    ops, funcs, others = [], [], []
    for op in module_ops:
        toks = first_tokens(op, 2)
        if toks and toks[0].kind in ("attr_alias", "type_alias") and len(toks) > 1 and toks[1].text == "=":
            aliases.append(_parse_alias(op))
            continue
        ops.append(op)
        if toks and toks[0].text == "func.func":
            funcs.append(parse_func(op))
        else:
            others.append(op)
    return ModuleText(tuple(aliases), tuple(ops), tuple(funcs), tuple(others))


def _parse_alias(op: str) -> AliasDef:
    toks = tokenize(op)
    if len(toks) < 3 or toks[0].kind not in ("attr_alias", "type_alias") or toks[1].text != "=":
        raise ValueError(f"expected an alias definition (`#name = ...` / `!name = ...`), found {op[:60]!r}")
    return AliasDef(toks[0].text[0], toks[0].text[1:], op)


def body_ops(func: FuncOp) -> tuple[list[str], str]:
    """The ops of a func body split into (ops before the terminator, terminator text)."""
    text = func.text
    spans = split_ops(text, *func.body)
    ops = [text[s:e] for s, e in spans]
    if not ops or op_name(ops[-1]) not in ("return", "func.return"):
        raise ValueError(f"func.func @{func.name}: body does not end with `return`")
    return ops[:-1], ops[-1]


# ------------------------------------------------------------------------------------- AIR op headers

AIR_REGION_OPS = ("air.launch", "air.segment", "air.herd")


@dataclass(frozen=True)
class AirOp:
    """Header of one `air.launch` / `air.segment` / `air.herd` op; spans index into `text`."""

    text: str
    name: str                                # op name
    results: str | None                      # `%0` of `%0 = air.launch ...`
    symbol: str | None                       # without `@`
    is_async: bool
    deps: tuple[str, ...]                    # async dependency operands
    ids: tuple[str, ...]                     # tile / launch induction values
    sizes: tuple[tuple[str, str], ...]       # (size value, operand)
    args: tuple[tuple[str, str], ...]        # (region argument, operand), SSA names without `%`
    arg_types: tuple[str, ...]
    attr_span: tuple[int, int] | None        # span of `attributes {...}` (keyword included)
    dict_span: tuple[int, int] | None        # span of the `{...}` dictionary
    region: tuple[int, int] | None           # span of `{ ... }` (braces included)

    @property
    def attributes(self) -> dict:
        return {} if self.dict_span is None else parse_attr_dict(self.text[slice(*self.dict_span)])

    @property
    def header(self) -> str:
        return self.text if self.region is None else self.text[:self.region[0]]


def parse_air_op(op_text: str) -> AirOp:
    cur = _Cursor(op_text, what="AIR op")
    results = _skip_results(cur)
    name = cur.next().text
    if name not in AIR_REGION_OPS:
        raise ValueError(f"expected one of {AIR_REGION_OPS}, found {name!r}")
    cur.what = name
    symbol = None
    if cur.peek() is not None and cur.peek().kind == "symbol":
        symbol = cur.next().text[1:]
        if symbol.startswith('"'):
            symbol = _unescape(symbol)
    is_async = cur.accept("async") is not None
    deps: tuple[str, ...] = ()
    if cur.at("["):
        a, b = cur.skip_group()
        deps = tuple(d[1:] for d in split_top_level(op_text[a + 1:b - 1]) if d)
    ids: tuple[str, ...] = ()
    sizes: tuple[tuple[str, str], ...] = ()
    keyword = cur.accept("tile") or cur.accept("unroll")
    if keyword is not None or (name == "air.launch" and cur.at("(")):
        a, b = cur.skip_group()
        ids = tuple(d[1:] for d in split_top_level(op_text[a + 1:b - 1]) if d)
        cur.expect("in")
        a, b = cur.skip_group()
        sizes = tuple(_pair(p, name) for p in split_top_level(op_text[a + 1:b - 1]) if p)
    args: tuple[tuple[str, str], ...] = ()
    arg_types: tuple[str, ...] = ()
    if cur.accept("args"):
        a, b = cur.skip_group()
        args = tuple(_pair(p, name) for p in split_top_level(op_text[a + 1:b - 1]) if p)
        if args:
            cur.expect(":")
            ts = cur.pos
            while cur.peek() is not None and cur.peek().text not in ("attributes", "{"):
                if cur.peek().text in _OPENERS:
                    cur.skip_group()
                else:
                    cur.next()
            arg_types = tuple(split_top_level(op_text[ts:cur.pos]))
            if len(arg_types) != len(args):
                raise ValueError(f"{name}: {len(args)} args but {len(arg_types)} types")
    attr_span = dict_span = None
    kw = cur.accept("attributes")
    if kw is not None:
        dict_span = cur.skip_group()
        attr_span = (kw.start, dict_span[1])
    region = None
    if cur.at("{"):
        region = cur.skip_group()
    if cur.peek() is not None:
        raise ValueError(f"{name}: unexpected text {op_text[cur.pos:cur.pos + 40]!r}")
    return AirOp(op_text, name, results, symbol, is_async, deps, ids, sizes, args, arg_types,
                 attr_span, dict_span, region)


def _pair(p: str, what: str) -> tuple[str, str]:
    toks = tokenize(p)
    if len(toks) != 3 or toks[0].kind != "ssa" or toks[1].text != "=" or toks[2].kind != "ssa":
        raise ValueError(f"{what}: expected `%inner=%operand`, found {p!r}")
    return toks[0].text[1:], toks[2].text[1:]


def memref_shape(type_text: str) -> tuple[tuple[int, ...], str]:
    """`memref<64x576xbf16>` -> ((64, 576), "bf16"); layouts / memory spaces after the element type ignored."""
    m = re.fullmatch(r"\s*memref<\s*((?:[0-9?]+x)*)([A-Za-z_][\w]*)\s*(?:,.*)?>\s*", type_text, re.DOTALL)
    if m is None:
        raise ValueError(f"not a memref type: {type_text!r}")
    dims = [d for d in m.group(1).split("x") if d]
    if "?" in dims:
        raise ValueError(f"dynamic memref dimensions are not supported: {type_text!r}")
    return tuple(int(d) for d in dims), m.group(2)
