"""Tokens, balanced brackets, top-level splitting, renaming and a lazy token cursor over MLIR text."""
from __future__ import annotations

import itertools
import re
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
    return list(iter_ops(text, start, end, comments=comments))


def iter_ops(text: str, start: int = 0, end: int | None = None, *, comments: bool = False) -> Iterator[tuple[int, int]]:
    """split_ops one span at a time, without holding the block's positions or a copy of a long op while the
    caller reads it. An unbalanced bracket raises when the scan reaches it (split_ops: before any span)."""
    end = len(text) if end is None else end
    last = start
    for p in itertools.chain(_depth_zero_positions(text, "\n", start, end), (end,)):
        seg = text[last:p]
        span = None
        if _has_code(seg) or (comments and seg.strip()):
            span = (last + (len(seg) - len(seg.lstrip())), last + len(seg.rstrip()))
        seg = None   # a region op spans most of its parent: no copy stays alive while the caller reads it
        last = p + 1
        if span is not None:
            yield span


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
