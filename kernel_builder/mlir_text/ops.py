"""The module layout (aliases, module-level ops, funcs) and the headers of `air.launch` / `air.segment` /
`air.herd` ops; region bodies are spans into the text, never re-parsed."""
from __future__ import annotations

import re
from dataclasses import dataclass

from kernel_builder.mlir_text.attrs import _unescape, parse_attr_dict
from kernel_builder.mlir_text.lexer import (_CLOSERS, _OPENERS, _TOKEN_RE, Tok, _Cursor, _depth_zero_positions,
                                            first_tokens, split_ops, split_top_level, tokenize)

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
        kind = m.lastgroup
        if kind in ("ws", "comment", "string"):
            continue
        word = m.group()
        if word in _OPENERS:
            depth += 1
        elif word in _CLOSERS:
            depth -= 1
            if depth < 0:   # unbalanced: split_ops below names it
                break
        elif depth == 0 and kind == "ident" and word in ("module", "builtin.module"):
            module_at = Tok(kind, word, m.start(), m.end())
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
        if _Cursor(text, b).peek() is not None:   # lazily: one token, not a list of all the tail's tokens
            raise ValueError(f"module: unexpected text after the module: {text[b:b + 200].strip()[:60]!r}")
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
