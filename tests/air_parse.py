"""Parsers of single constructs of the AIR text, over one op's tokens (air_checks.py walks the AIR reader's tree
and calls them): the records they fill (AirOp - built from the reader's header -, Decl, Channel, ChannelAccess,
Report), func headers, channel declarations and put/get, and the result type of simple ops. Malformed input is
reported through `err`."""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from air_tokens import Tok, matching, norm_type, parse_attr_dict, parse_type

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
    op_tokens: list = field(default_factory=list)      # each scanned op's own tokens (air_generic rewrites them)

    @property
    def herds(self) -> list[AirOp]:
        return [op for op in self.air_ops if op.kind == "air.herd"]


_INDEX_OPS = {"arith.muli", "arith.addi", "arith.subi", "arith.divui", "arith.remui", "arith.minui",
              "arith.maxui", "arith.addf", "arith.mulf", "arith.divf", "arith.subf", "arith.extf",
              "arith.truncf", "math.rsqrt", "memref.load", "arith.select"}


def result_type(toks: list[Tok], i: int) -> str | None:
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


def int_list(toks: list[Tok], i: int) -> tuple[list[int] | None, int]:
    """`[1, 2]` at toks[i] -> ([1, 2], index after `]`); None if an entry is not an integer."""
    close = matching(toks, i)
    vals = [x.text for x in toks[i + 1:close] if x.text != ","]
    if not all(re.fullmatch(r"\d+", v) for v in vals):
        return None, close + 1
    return [int(v) for v in vals], close + 1


def parse_channel_decl(toks, i, rep, err, at_module: bool) -> int:
    """`air.channel @sym [d0, d1] {broadcast_shape = [b0, b1], ...}`; returns the index after it."""
    t = toks[i]
    if i + 2 >= len(toks) or toks[i + 1].kind != "sym" or toks[i + 2].text != "[":
        err("air.channel: expected `@symbol [sizes]`", t.start)
        return i + 1
    sym = toks[i + 1].text[1:]
    size, j = int_list(toks, i + 2)
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


def parse_channel_access(toks, i, air_stack, err):
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


def parse_func(toks, i, rep, err) -> int:
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
