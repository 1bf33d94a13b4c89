"""Structure checks for the MLIR-AIR text our builders and the stitcher generate.

mlir-opt-22 cannot parse the AIR dialect's custom syntax, so this module
  * scans the text with a small tokenizer + balanced-bracket walker and checks what AIR would check
    (SSA scoping with isolated launch/segment/herd regions, `args(...)` vs `: types`, bound value types,
    memory spaces, external calls vs declarations and `link_with`, the `llama_npu.kernel` attribute), and
  * rewrites the AIR ops into MLIR's *generic* op form (`"air.herd"(...) ({ ^bb0(...): ... }) {...} : ...`)
    so mlir-opt-22 --allow-unregistered-dialect can parse/verify everything else (types, func.call
    signatures, linalg/scf/arith/memref ops). `herd_modules()` additionally extracts each herd body into a
    standalone func taking the herd's block arguments as parameters.

Usage: `report = check_module(text)`; `report.errors` is empty for a valid module; `report.kernels` lists the
`llama_npu.kernel` attributes of the launches / bare herds in order.
"""
from __future__ import annotations

import re
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

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

AIR_REGION_OPS = ("air.launch", "air.segment", "air.herd")
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


def _is_attr_dict(toks: list[Tok], i: int) -> bool:
    nxt = toks[i + 1] if i + 1 < len(toks) else None
    if nxt is None or nxt.text == "}":
        return True
    after = toks[i + 2].text if i + 2 < len(toks) else ""
    return nxt.kind in ("ident", "str") and after in ("=", ",", "}")


@dataclass
class AirOp:
    kind: str                 # air.launch / air.segment / air.herd
    symbol: str | None
    ids: list[str]
    size_args: list[str]
    sizes: list[str]          # size operands (outer values)
    arg_names: list[str]      # block arguments bound by args(...)
    operands: list[str]       # outer values bound by args(...)
    types: list[str]          # declared `: types`
    attrs: dict
    attr_span: tuple[int, int] | None  # text span of the attribute dict
    header_span: tuple[int, int]       # op keyword .. body "{" inclusive
    body_close: int           # text offset of the body's closing "}"
    body_tok: tuple[int, int] # token indices of body "{" and "}"
    parent: "AirOp | None"
    func_level: bool          # directly in a func body
    deps: list[str] = field(default_factory=list)  # async dependency tokens `[%t, ...]`


@dataclass
class Decl:
    symbol: str
    types: list[str]
    attrs: dict


@dataclass
class Channel:
    symbol: str
    size: list[int]
    broadcast_shape: list[int] | None
    span: tuple[int, int]          # text span of the declaration


@dataclass
class ChannelAccess:
    kind: str                      # "put" / "get"
    symbol: str
    indices: list[str]
    buffer: str
    lists: list[list[str]]         # offsets, sizes, strides (SSA names)
    type: str
    region: str | None             # innermost AIR region kind (air.segment / air.herd / ...) or None
    span: tuple[int, int]          # text span of the op


@dataclass
class Report:
    errors: list[str] = field(default_factory=list)
    air_ops: list[AirOp] = field(default_factory=list)
    decls: dict = field(default_factory=dict)          # symbol -> list[Decl]
    public: list[tuple[str, list[str], list[str]]] = field(default_factory=list)  # (name, arg names, types)
    kernels: list[dict] = field(default_factory=list)  # llama_npu.kernel of launches / bare herds
    channels: dict = field(default_factory=dict)       # symbol -> Channel
    channel_ops: list = field(default_factory=list)    # ChannelAccess, in text order

    @property
    def herds(self) -> list[AirOp]:
        return [op for op in self.air_ops if op.kind == "air.herd"]


class _Scope:
    def __init__(self, isolated: bool, owner=None, types: dict | None = None):
        self.isolated = isolated
        self.owner = owner  # AirOp / "func" / None
        self.types: dict[str, str | None] = dict(types or {})


_INDEX_OPS = {"arith.muli", "arith.addi", "arith.subi", "arith.divui", "arith.remui", "arith.minui",
              "arith.maxui", "arith.addf", "arith.mulf", "arith.divf", "arith.subf", "arith.extf",
              "arith.truncf", "math.rsqrt", "memref.load", "arith.select"}


def _result_type(toks: list[Tok], i: int) -> str | None:
    """Type of the single result of the op starting at toks[i] (the op name), when easy to know."""
    name = toks[i].text
    if name == "arith.cmpi" or name == "arith.cmpf":
        return "i1"
    if name in ("memref.alloc", "arith.constant") or name in _INDEX_OPS or name == "arith.index_cast":
        # scan to the op's trailing ':' at bracket depth 0 on the same statement
        j, depth = i + 1, 0
        colon = None
        while j < len(toks):
            t = toks[j].text
            if t in "([{<":
                depth += 1
            elif t in ")]}>":
                depth -= 1
            elif depth == 0 and t == ":":
                colon = j
                break
            j += 1
        if colon is None:
            return None
        ty, k = parse_type(toks, colon + 1)
        if name in ("arith.index_cast", "arith.extf", "arith.truncf") and k < len(toks) and toks[k].text == "to":
            ty, _ = parse_type(toks, k + 1)
        if name == "memref.load":
            m = re.match(r"memref<(?:\d+x)*([a-z0-9]+)", ty)
            return m.group(1) if m else None
        return ty
    return None


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


def check_module(text: str, expect_kernels: list[dict] | None = None) -> Report:
    rep = Report()
    try:
        toks = tokenize(text)
    except ValueError as e:
        rep.errors.append(str(e))
        return rep
    scopes: list[_Scope] = [_Scope(True, "module")]
    pending: dict | None = None  # next region's block args / owner
    calls: list[tuple[str, list[str], AirOp | None, int]] = []
    herd_stack: list[AirOp] = []
    air_stack: list[AirOp] = []
    func_depth = 0

    def err(msg: str, off: int) -> None:
        line = text.count("\n", 0, off) + 1
        rep.errors.append(f"line {line}: {msg}")

    def lookup(name: str) -> tuple[bool, str | None]:
        for sc in reversed(scopes):
            if name in sc.types:
                return True, sc.types[name]
            if sc.isolated:
                return False, None
        return False, None

    def use(tok: Tok) -> None:
        found, _ = lookup(tok.text)
        if not found:
            err(f"{tok.text} used but not defined in scope (regions of launch/segment/herd/func are "
                f"isolated from above)", tok.start)

    i, n = 0, len(toks)
    while i < n:
        t = toks[i]
        if t.kind == "ident" and t.text == "air.channel":
            i = _parse_channel_decl(toks, i, rep, err, at_module=(func_depth == 0 and len(scopes) <= 2))
            continue
        if t.kind == "ident" and t.text in ("air.channel.put", "air.channel.get"):
            acc, i = _parse_channel_access(toks, i, air_stack, err)
            if acc is not None:
                rep.channel_ops.append(acc)
                for v in acc.indices + [acc.buffer] + sum(acc.lists, []):
                    use(Tok("ssa", v, t.start, t.start))
                found, ty = lookup(acc.buffer)
                if found and ty is not None and ty != acc.type:
                    err(f"{t.text} on {acc.buffer}: declared type {acc.type} != its type {ty}", t.start)
            continue
        if t.kind == "ident" and t.text == "func.func":
            i = _parse_func(toks, i, rep, err)
            if rep.public and rep.public[-1][3] == i:  # has a body: next "{" is its region
                name, args, types, _ = rep.public[-1]
                rep.public[-1] = (name, args, types, None)
                pending = {"args": dict(zip(args, types)), "isolated": True, "owner": "func"}
                bad = [ty for ty in types if memory_space(ty) not in ("", None)]
                for ty in bad:
                    err(f"public func @{name} argument type {ty} must be an L3 memref (no memory space)",
                        toks[i - 1].start)
            continue
        if t.kind == "ident" and t.text in AIR_REGION_OPS:
            parent = air_stack[-1] if air_stack else None
            op, i = _parse_air_header(toks, i, parent, func_level=(not air_stack and func_depth > 0))
            if op is None:
                err(f"cannot parse {t.text} header", t.start)
                i += 1
                continue
            rep.air_ops.append(op)
            _check_air_op(op, lookup, err, rep)
            for v in op.sizes + op.operands + op.deps:
                use(Tok("ssa", v, t.start, t.start))
            block = {a: "index" for a in op.ids + op.size_args}
            block.update(zip(op.arg_names, op.types))
            pending = {"args": block, "isolated": True, "owner": op}
            continue
        if t.kind == "ident" and t.text == "scf.for":
            iv = toks[i + 1].text
            j = i + 3  # skip "%iv ="
            block = {iv: "index"}
            while toks[j].text != "{":
                tk = toks[j]
                if tk.text == "iter_args":
                    close = matching(toks, j + 1)
                    k = j + 2
                    while k < close:
                        block[toks[k].text] = None
                        use(toks[k + 2])
                        k += 4 if toks[k + 3].text == "," else 3
                    j = close + 1
                    continue
                if tk.kind == "ssa":
                    use(tk)
                j += 1
            pending = {"args": block, "isolated": False, "owner": None}
            i = j
            continue
        if t.kind == "caret":  # block label with arguments: ^bb0(%a: T, ...):
            if i + 1 < n and toks[i + 1].text == "(":
                close = matching(toks, i + 1)
                k = i + 2
                while k < close:
                    if toks[k].kind == "ssa":
                        ty, k2 = parse_type(toks, k + 2)
                        scopes[-1].types[toks[k].text] = ty
                        k = k2
                    else:
                        k += 1
                i = close + 1
                continue
        if t.text == "{":
            if pending is None and _is_attr_dict(toks, i):
                i = matching(toks, i) + 1
                continue
            pend = pending or {"args": {}, "isolated": False, "owner": None}
            pending = None
            sc = _Scope(pend["isolated"], pend["owner"], pend["args"])
            scopes.append(sc)
            if pend["owner"] == "func":
                func_depth += 1
            elif isinstance(pend["owner"], AirOp):
                air_stack.append(pend["owner"])
                if pend["owner"].kind == "air.herd":
                    herd_stack.append(pend["owner"])
            i += 1
            continue
        if t.text == "}":
            if len(scopes) <= 1:
                err("unbalanced '}'", t.start)
                i += 1
                continue
            sc = scopes.pop()
            if sc.owner == "func":
                func_depth -= 1
            elif isinstance(sc.owner, AirOp):
                air_stack.pop()
                if sc.owner.kind == "air.herd":
                    herd_stack.pop()
            i += 1
            continue
        if t.kind == "ssa":
            nxt = toks[i + 1].text if i + 1 < n else ""
            if nxt == "=" or (nxt == ":" and i + 3 < n and toks[i + 2].kind == "num" and toks[i + 3].text == "="):
                k = i + 2 if nxt == "=" else i + 4
                if t.text in scopes[-1].types:
                    err(f"{t.text} defined twice", t.start)
                scopes[-1].types[t.text] = _result_type(toks, k) if k < n else None
                if k < n and toks[k].text == "memref.alloc":
                    _check_alloc(scopes[-1].types[t.text], air_stack, err, t.start)
                i = k
                continue
            use(t)
            i += 1
            continue
        if t.kind == "ident" and t.text == "func.call":
            sym = toks[i + 1].text[1:]
            close = matching(toks, i + 2)
            operands = [x.text for x in toks[i + 3:close] if x.kind == "ssa"]
            for x in toks[i + 3:close]:
                if x.kind == "ssa":
                    use(x)
            ftype, k = parse_type(toks, close + 2)
            calls.append((sym, operands, herd_stack[-1] if herd_stack else None, t.start, ftype))
            i = k
            continue
        if t.kind == "ident" and t.text == "memref" and i + 1 < n and toks[i + 1].text == "<":
            j = matching(toks, i + 1)
            raw = text[t.start:toks[j].end]
            sp = memory_space(norm_type(toks[i:j + 1]))
            if sp not in ("", "1:i32", "2:i32"):
                err(f"memory space of {raw} must be absent (L3), `1 : i32` (L2) or `2 : i32` (L1)", t.start)
            i = j + 1
            continue
        i += 1

    if len(scopes) != 1:
        rep.errors.append("unbalanced braces at end of module")
    _check_calls(calls, rep, err)
    _check_channels(rep, err)
    _check_nesting_and_kernels(rep, err)
    if expect_kernels is not None and rep.kernels != expect_kernels:
        rep.errors.append(f"llama_npu.kernel attributes {rep.kernels} != expected {expect_kernels}")
    return rep


def _int_list(toks: list[Tok], i: int) -> tuple[list[int] | None, int]:
    """`[1, 2]` at toks[i] -> ([1, 2], index after `]`); None if an entry is not an integer."""
    close = matching(toks, i)
    vals = [x.text for x in toks[i + 1:close] if x.text != ","]
    if not all(re.fullmatch(r"\d+", v) for v in vals):
        return None, close + 1
    return [int(v) for v in vals], close + 1


def _parse_channel_decl(toks, i, rep, err, at_module: bool) -> int:
    """`air.channel @sym [d0, d1] {broadcast_shape = [b0, b1], ...}`; returns the index after it."""
    t = toks[i]
    if i + 2 >= len(toks) or toks[i + 1].kind != "sym" or toks[i + 2].text != "[":
        err("air.channel: expected `@symbol [sizes]`", t.start)
        return i + 1
    sym = toks[i + 1].text[1:]
    size, j = _int_list(toks, i + 2)
    bshape, end = None, toks[j - 1].end
    if j < len(toks) and toks[j].text == "{":
        attrs, j2 = parse_attr_dict(toks, j)
        end = toks[j2 - 1].end
        if "broadcast_shape" in attrs:
            inner = str(attrs["broadcast_shape"]).strip("[]")
            bshape = [int(v) for v in inner.split(",")] if re.fullmatch(r"\d+(,\d+)*", inner) else None
            if bshape is None:
                err(f"air.channel @{sym}: broadcast_shape must be a list of integers", t.start)
        j = j2
    if not at_module:
        err(f"air.channel @{sym} must be declared at module level", t.start)
    if size is None or not size or any(d <= 0 for d in size):
        err(f"air.channel @{sym}: sizes must be positive integers", t.start)
        return j
    if sym in rep.channels:
        err(f"air.channel @{sym} declared twice", t.start)
    if bshape is not None:
        if len(bshape) != len(size):
            err(f"air.channel @{sym}: broadcast_shape rank {len(bshape)} != bundle rank {len(size)}", t.start)
        elif any(d != 1 and d != b for d, b in zip(size, bshape)):
            err(f"air.channel @{sym}: size {size} does not broadcast to {bshape} (each size must be 1 or "
                f"equal to the broadcast extent)", t.start)
    rep.channels[sym] = Channel(sym, size, bshape, (t.start, end))
    return j


def _parse_channel_access(toks, i, air_stack, err):
    """Synchronous `air.channel.put|get @sym[indices] (%buf[offs] [sizes] [strides]) : (type)`."""
    t = toks[i]
    kind = t.text.rsplit(".", 1)[1]
    j = i + 1
    if toks[j].text == "async" or toks[j].text == "[":
        err(f"{t.text}: only the synchronous form is supported by these checks", t.start)
        return None, i + 1
    if toks[j].kind != "sym" or toks[j + 1].text != "[":
        err(f"{t.text}: expected `@channel[indices]`", t.start)
        return None, i + 1
    sym = toks[j].text[1:]
    close = matching(toks, j + 1)
    indices = [x.text for x in toks[j + 2:close] if x.kind == "ssa"]
    k = close + 1
    if toks[k].text != "(" or toks[k + 1].kind != "ssa":
        err(f"{t.text} @{sym}: expected `(%buffer[offsets] [sizes] [strides])`", t.start)
        return None, i + 1
    pclose = matching(toks, k)
    buf, lists, m = toks[k + 1].text, [], k + 2
    for _ in range(3):
        if toks[m].text != "[":
            err(f"{t.text} @{sym}: expected three `[...]` lists after {buf}", t.start)
            return None, pclose + 1
        c = matching(toks, m)
        lists.append([x.text for x in toks[m + 1:c] if x.kind == "ssa"])
        m = c + 1
    if m != pclose or not (len(lists[0]) == len(lists[1]) == len(lists[2])):
        err(f"{t.text} @{sym}: offsets/sizes/strides of {buf} differ in length", t.start)
    if toks[pclose + 1].text != ":" or toks[pclose + 2].text != "(":
        err(f"{t.text} @{sym}: expected `: (memref type)`", t.start)
        return None, pclose + 1
    tclose = matching(toks, pclose + 2)
    ty = norm_type(toks[pclose + 3:tclose])
    region = air_stack[-1].kind if air_stack else None
    return ChannelAccess(kind, sym, indices, buf, lists, ty, region, (t.start, toks[tclose].end)), tclose + 1


def _check_channels(rep: Report, err) -> None:
    """Every put/get names a declared channel with matching rank; every channel has both ends; a get into
    L1 must run in a herd (the only place L1 exists)."""
    used: dict[str, set] = {}
    for acc in rep.channel_ops:
        ch = rep.channels.get(acc.symbol)
        if ch is None:
            err(f"air.channel.{acc.kind} uses undeclared channel @{acc.symbol}", acc.span[0])
            continue
        used.setdefault(acc.symbol, set()).add(acc.kind)
        if acc.indices and len(acc.indices) != len(ch.size):
            err(f"air.channel.{acc.kind} @{acc.symbol}: {len(acc.indices)} indices for a rank-{len(ch.size)} "
                f"channel", acc.span[0])
        if memory_space(acc.type) == "2:i32" and acc.region != "air.herd":
            err(f"air.channel.{acc.kind} @{acc.symbol} on an L1 buffer outside an air.herd", acc.span[0])
    for sym, ch in rep.channels.items():
        missing = {"put", "get"} - used.get(sym, set())
        if missing:
            err(f"air.channel @{sym} has no {' / '.join(sorted(missing))}", ch.span[0])


def _parse_func(toks, i, rep, err) -> int:
    """func.func [private] @name(args) [-> results] [attributes {...}] [{ body ]; returns the index after the
    header. For a public func with body, appends (name, args, types, index_of_body_brace) to rep.public."""
    j = i + 1
    private = toks[j].text == "private"
    if private:
        j += 1
    name = toks[j].text[1:]
    close = matching(toks, j + 1)
    args, types = [], []
    k = j + 2
    while k < close:
        if toks[k].kind == "ssa":
            args.append(toks[k].text)
            ty, k = parse_type(toks, k + 2)
            types.append(ty)
        elif toks[k].text == ",":
            k += 1
        else:
            ty, k = parse_type(toks, k)
            types.append(ty)
    k = close + 1
    if k < len(toks) and toks[k].kind == "arrow":
        if toks[k + 1].text == "(":
            k = matching(toks, k + 1) + 1
        else:
            _, k = parse_type(toks, k + 1)
    attrs = {}
    if k < len(toks) and toks[k].text == "attributes":
        attrs, k = parse_attr_dict(toks, k + 1)
    if private:
        rep.decls.setdefault(name, []).append(Decl(name, types, attrs))
        return k
    if k < len(toks) and toks[k].text == "{":
        rep.public.append((name, args, types, k))
    return k


def _parse_air_header(toks, i, parent, func_level):
    kind = toks[i].text
    start = toks[i].start
    j = i + 1
    symbol = None
    if toks[j].kind == "sym":
        symbol = toks[j].text[1:]
        j += 1
    deps = []
    if toks[j].text == "async":  # `%t = air.launch async [%d0, %d1] (...)`: the result is a token
        j += 1
        if toks[j].text == "[":
            close = matching(toks, j)
            deps = [t.text for t in toks[j + 1:close] if t.kind == "ssa"]
            j = close + 1
    ids, size_args, sizes = [], [], []
    if kind == "air.herd":
        if toks[j].text != "tile":
            return None, i + 1
        j += 1
    if kind == "air.segment" and toks[j].text == "unroll":
        j += 1
    if kind != "air.segment" or toks[j - 1].text == "unroll":
        close = matching(toks, j)
        ids = [t.text for t in toks[j + 1:close] if t.kind == "ssa"]
        j = close + 1
        if toks[j].text != "in":
            return None, i + 1
        close = matching(toks, j + 1)
        k = j + 2
        while k < close:
            size_args.append(toks[k].text)
            sizes.append(toks[k + 2].text)
            k += 4
        j = close + 1
    arg_names, operands, types = [], [], []
    if toks[j].text == "args":
        close = matching(toks, j + 1)
        k = j + 2
        while k < close:
            arg_names.append(toks[k].text)
            operands.append(toks[k + 2].text)
            k += 4
        j = close + 1
        if toks[j].text == ":":
            types, j = parse_type_list(toks, j + 1, ("attributes", "{"))
    attrs, attr_span = {}, None
    if toks[j].text == "attributes":
        a0 = toks[j + 1].start
        attrs, j2 = parse_attr_dict(toks, j + 1)
        attr_span = (a0, toks[j2 - 1].end)
        j = j2
    if toks[j].text != "{":
        return None, i + 1
    body_close = matching(toks, j)
    op = AirOp(kind, symbol, ids, size_args, sizes, arg_names, operands, types, attrs, attr_span,
               (start, toks[j].end), toks[body_close].start, (j, body_close), parent, func_level, deps)
    return op, j


def _check_air_op(op: AirOp, lookup, err, rep) -> None:
    where = f"{op.kind} @{op.symbol}" if op.symbol else op.kind
    if len(op.arg_names) != len(op.types):
        err(f"{where}: args(...) binds {len(op.arg_names)} values but declares {len(op.types)} types",
            op.header_span[0])
    if len(set(op.arg_names)) != len(op.arg_names):
        err(f"{where}: duplicate block argument names", op.header_span[0])
    for val, ty in zip(op.operands, op.types):
        found, actual = lookup(val)
        if found and actual is None:
            err(f"{where}: cannot determine the type of bound value {val}", op.header_span[0])
        elif found and actual != ty:
            err(f"{where}: bound value {val} has type {actual} but args declares {ty}", op.header_span[0])
    if op.kind == "air.herd" and len(op.ids) != 2:
        err(f"{where}: a herd has 2 tile dimensions, got {len(op.ids)}", op.header_span[0])
    if len(op.ids) != len(op.sizes):
        err(f"{where}: {len(op.ids)} ids but {len(op.sizes)} sizes", op.header_span[0])


def _check_alloc(ty, air_stack, err, off) -> None:
    if ty is None:
        err("memref.alloc without a parsable result type", off)
        return
    sp = memory_space(ty)
    inner = air_stack[-1].kind if air_stack else None
    want = {"air.herd": "2:i32", "air.segment": "1:i32"}.get(inner)
    if want is None:
        err(f"memref.alloc {ty} outside a segment/herd (L3 buffers must be function arguments)", off)
    elif sp != want:
        err(f"memref.alloc {ty} inside {inner} must use memory space {want.replace(':', ' : ')}", off)


def _check_calls(calls, rep: Report, err) -> None:
    for sym, operands, herd_op, off, ftype in calls:
        decls = rep.decls.get(sym, [])
        if len(decls) != 1:
            err(f"func.call @{sym}: declared {len(decls)} times (need exactly one private declaration)", off)
            continue
        d = decls[0]
        link = d.attrs.get("link_with")
        if not link:
            err(f"@{sym}: declaration has no link_with", off)
        if "llvm.emit_c_interface" not in d.attrs:
            err(f"@{sym}: declaration lacks llvm.emit_c_interface", off)
        if herd_op is None:
            err(f"func.call @{sym} outside a herd", off)
        elif herd_op.attrs.get("link_with") != link:
            err(f"func.call @{sym}: herd @{herd_op.symbol} link_with={herd_op.attrs.get('link_with')!r} but "
                f"the declaration links {link!r}", off)
        want = "(" + ",".join(d.types) + ")->()"
        if ftype != want:
            err(f"func.call @{sym}: call type {ftype} != declared {want}", off)
        if len(operands) != len(d.types):
            err(f"func.call @{sym}: {len(operands)} operands, declaration has {len(d.types)}", off)


def _check_nesting_and_kernels(rep: Report, err) -> None:
    for op in rep.air_ops:
        pk = op.parent.kind if op.parent else None
        off = op.header_span[0]
        if op.kind == "air.launch" and not op.func_level:
            err("air.launch must be directly in the func body", off)
        if op.kind == "air.segment" and pk != "air.launch":
            err("air.segment must be directly inside an air.launch", off)
        if op.kind == "air.herd" and not (pk == "air.segment" or (op.parent is None and op.func_level)):
            err("air.herd must be inside an air.segment or bare in the func body", off)
        top = op.kind == "air.launch" or (op.kind == "air.herd" and op.parent is None)
        kernel = op.attrs.get("llama_npu.kernel")
        if top:
            if not isinstance(kernel, dict) or "kind" not in kernel:
                err(f"{op.kind}: missing llama_npu.kernel = {{kind = ..., ...}} attribute", off)
            else:
                rep.kernels.append(kernel)
        elif kernel is not None:
            err(f"{op.kind}: llama_npu.kernel belongs on the launch (or bare herd) only", off)


# --- generic-form rewriting for mlir-opt ---------------------------------------------------------------
def to_generic(text: str, keep_calls: bool = False) -> str:
    """Rewrite AIR region ops and air.dma_memcpy_nd into MLIR generic form (parsable by upstream
    mlir-opt with --allow-unregistered-dialect); everything else is left byte-identical.

    mlir-opt stops symbol lookup at unregistered ops, so unless `keep_calls`, `func.call @f(..) : T`
    becomes `"llama_npu.extcall"(..) {callee = @f} : T` (check_module verifies calls against the
    declarations itself; herd_modules() keeps real func.calls, verified by mlir-opt)."""
    rep = check_module(text)
    toks = tokenize(text)
    edits: list[tuple[int, int, str]] = []
    for op in rep.air_ops:
        sizes_types = ["index"] * len(op.sizes)
        operands = op.sizes + op.operands
        block_args = [f"{a}: index" for a in op.ids + op.size_args] + \
            [f"{a}: {_pretty(t)}" for a, t in zip(op.arg_names, op.types)]
        attrs = text[op.attr_span[0] + 1:op.attr_span[1] - 1].strip() if op.attr_span else ""
        if op.symbol:
            attrs = f'air.sym_name = "{op.symbol}"' + (", " + attrs if attrs else "")
        header = f'"{op.kind}"({", ".join(operands)}) ({{\n^bb0({", ".join(block_args)}):'
        if not block_args:
            header = f'"{op.kind}"({", ".join(operands)}) ({{\n^bb0:'
        fn_type = "(" + ", ".join(sizes_types + [_pretty(t) for t in op.types]) + ") -> ()"
        term = op.kind.split(".")[1] + "_terminator"
        footer = f'  "air.{term}"() : () -> ()\n}}) {{{attrs}}} : {fn_type}'
        edits.append((op.header_span[0], op.header_span[1], header))
        edits.append((op.body_close, op.body_close + 1, footer))
    edits += _dma_edits(toks)
    edits += _channel_edits(rep)
    if not keep_calls:
        for i, t in enumerate(toks):
            if t.text == "func.call":
                close = matching(toks, i + 2)
                edits.append((t.start, toks[i + 1].end, '"llama_npu.extcall"'))
                edits.append((toks[close].end, toks[close].end, f" {{callee = {toks[i + 1].text}}}"))
    out = text
    for s, e, rep_text in sorted(edits, key=lambda x: x[0], reverse=True):
        out = out[:s] + rep_text + out[e:]
    return out


def _pretty(ty: str) -> str:
    # normalized "memref<64x64xbf16,2:i32>" -> parsable text (mlir accepts it without spaces as well)
    return ty


def _dma_edits(toks: list[Tok]) -> list[tuple[int, int, str]]:
    edits = []
    for i, t in enumerate(toks):
        if t.text != "air.dma_memcpy_nd":
            continue
        close = matching(toks, i + 1)
        groups, k = [], i + 2
        for _ in range(2):  # dst then src
            buf = toks[k].text
            lists = []
            k += 1
            for _ in range(3):
                c = matching(toks, k)
                lists.append([x.text for x in toks[k + 1:c] if x.kind == "ssa"])
                k = c + 1
            groups.append((buf, lists))
            if toks[k].text == ",":
                k += 1
        assert k == close, "malformed air.dma_memcpy_nd operand list"
        j = close + 1
        assert toks[j].text == ":", "air.dma_memcpy_nd: expected ': (dst type, src type)'"
        types, j = parse_type_list(toks, j + 2, (")",))
        end = toks[j].end  # closing paren of the type pair
        operands, optypes = [], []
        for (buf, lists), ty in zip(groups, types):
            operands.append(buf)
            optypes.append(ty)
            for lst in lists:
                operands += lst
                optypes += ["index"] * len(lst)
        text = f'"air.dma_memcpy_nd"({", ".join(operands)}) : ({", ".join(optypes)}) -> ()'
        edits.append((t.start, end, text))
    return edits


def _channel_edits(rep: Report) -> list[tuple[int, int, str]]:
    """Channel declarations and put/get in generic form: the channel symbol becomes `sym_name` /
    `chan_name = @sym`, the operands are indices, buffer, offsets, sizes, strides (AIR's operand order)."""
    edits = []
    for ch in rep.channels.values():
        attrs = [f'sym_name = "{ch.symbol}"', f"size = [{', '.join(map(str, ch.size))}]"]
        if ch.broadcast_shape is not None:
            attrs.append(f"broadcast_shape = [{', '.join(map(str, ch.broadcast_shape))}]")
        edits.append((ch.span[0], ch.span[1], f'"air.channel"() {{{", ".join(attrs)}}} : () -> ()'))
    for acc in rep.channel_ops:
        ops = acc.indices + [acc.buffer] + sum(acc.lists, [])
        types = ["index"] * len(acc.indices) + [acc.type] + ["index"] * sum(len(x) for x in acc.lists)
        edits.append((acc.span[0], acc.span[1], f'"air.channel.{acc.kind}"({", ".join(ops)}) '
                      f'{{chan_name = @{acc.symbol}}} : ({", ".join(types)}) -> ()'))
    return edits


def herd_modules(text: str) -> list[tuple[str, str]]:
    """One standalone module per herd: the module's private declarations + `func.func @<herd>(block args)`
    whose body is the herd body (AIR ops in generic form)."""
    rep = check_module(text)
    decl_lines = _decl_texts(text)
    out = []
    for idx, op in enumerate(rep.herds):
        body = text[op.header_span[1]:op.body_close]
        params = [f"{a}: index" for a in op.ids + op.size_args] + \
            [f"{a}: {t}" for a, t in zip(op.arg_names, op.types)]
        name = f"herd_{idx}_{op.symbol or 'anon'}"
        mod = "module {\n" + "".join(f"  {d}\n" for d in decl_lines) + \
            f"  func.func @{name}({', '.join(params)}) {{\n{to_generic(body, keep_calls=True)}\n    return\n  }}\n}}\n"
        out.append((name, mod))
    return out


def signature_module(text: str) -> str:
    """The module's declarations + its public func(s) with an empty body."""
    rep = check_module(text)
    lines = ["module {"] + [f"  {d}" for d in _decl_texts(text)]
    for name, args, types, _ in rep.public:
        sig = ", ".join(f"{a}: {t}" for a, t in zip(args, types))
        lines.append(f"  func.func @{name}({sig}) {{\n    return\n  }}")
    return "\n".join(lines + ["}"]) + "\n"


def _decl_texts(text: str) -> list[str]:
    toks = tokenize(text)
    out = []
    for i, t in enumerate(toks):
        if t.text == "func.func" and toks[i + 1].text == "private":
            close = matching(toks, i + 3)
            end = toks[close].end
            k = close + 1
            if k < len(toks) and toks[k].text == "attributes":
                end = toks[matching(toks, k + 1)].end
            out.append(text[t.start:end])
    return out


def mlir_opt_verify(mlir_opt: str, text: str, unregistered: bool = True) -> None:
    """Parse + verify with mlir-opt; raises AssertionError with the diagnostics on failure."""
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "m.mlir"
        path.write_text(text)
        cmd = [mlir_opt, str(path), "-o", "/dev/null"]
        if unregistered:
            cmd.insert(1, "--allow-unregistered-dialect")
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    if res.returncode != 0:
        raise AssertionError(f"mlir-opt rejected the module:\n{res.stderr}\n--- module ---\n{text}")
