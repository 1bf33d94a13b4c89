"""Structure checks for the MLIR-AIR text our builders and the stitcher generate.

mlir-opt-22 cannot parse the AIR dialect's custom syntax, so these test helpers
  * walk the one AIR reader's tree of the module (kernel_builder.air_module: the module layout, the public func's
    ops with their regions and AIR op headers - the tree the hardware model and the interpreter read) and check
    what AIR would check (SSA scoping with isolated launch/segment/herd regions, `args(...)` vs `: types`, bound
    value types, memory spaces, external calls vs declarations and `link_with`, the `llama_npu.kernel`
    attribute): this module, with air_tokens (each op's tokens from the reader's lexer, aliases expanded; types,
    attributes) and air_parse (single constructs, the Report), and
  * rewrite the AIR ops into MLIR's *generic* op form (`"air.herd"(...) ({ ^bb0(...): ... }) {...} : ...`)
    so mlir-opt-22 --allow-unregistered-dialect can parse/verify everything else (types, func.call
    signatures, linalg/scf/arith/memref ops): air_generic. `air_generic.herd_modules()` additionally extracts
    each herd body into a standalone func taking the herd's block arguments as parameters.

Usage: `report = check_module(text)`; `report.errors` is empty for a valid module; `report.kernels` lists the
`llama_npu.kernel` attributes of the launches / bare herds in order.
"""
from __future__ import annotations

from air_parse import (AirOp, Report, parse_channel_access, parse_channel_decl, parse_func, result_type)
from air_tokens import Tok, alias_defs, matching, memory_space, norm_type, parse_attr_dict, parse_type, tokenize

from kernel_builder import air_module
from kernel_builder import mlir_text as mt

AIR_REGION_OPS = mt.AIR_REGION_OPS


class _Scope:
    def __init__(self, isolated: bool, owner=None, types: dict | None = None):
        self.isolated = isolated
        self.owner = owner  # AirOp / "func" / None
        self.types: dict[str, str | None] = dict(types or {})


def check_module(text: str, expect_kernels: list[dict] | None = None) -> Report:
    rep = Report()
    try:
        layout = air_module.read(text).layout
        checker = _Checker(text, rep, alias_defs(a.text for a in layout.aliases))
        checker.module(layout)
    except ValueError as e:
        rep.errors.append(str(e))
        return rep
    _check_calls(checker.calls, rep, checker.err)
    _check_channels(rep, checker.err)
    _check_nesting_and_kernels(rep, checker.err)
    if expect_kernels is not None and rep.kernels != expect_kernels:
        rep.errors.append(f"llama_npu.kernel attributes {rep.kernels} != expected {expect_kernels}")
    return rep


class _Checker:
    """Walks the reader's tree; each op's own tokens (its region excluded) are scanned for definitions, uses,
    types, calls and channel ops."""

    def __init__(self, text: str, rep: Report, defs: dict):
        self.text, self.rep, self.defs = text, rep, defs
        self.scopes: list[_Scope] = [_Scope(True, "module")]
        self.calls: list = []
        self.herd_stack: list[AirOp] = []
        self.air_stack: list[AirOp] = []
        self.in_func = False

    def toks(self, start: int, end: int) -> list[Tok]:
        return tokenize(self.text, start, end, self.defs)

    def err(self, msg: str, off: int) -> None:
        self.rep.errors.append(f"line {self.text.count(chr(10), 0, off) + 1}: {msg}")

    def lookup(self, name: str) -> tuple[bool, str | None]:
        for sc in reversed(self.scopes):
            if name in sc.types:
                return True, sc.types[name]
            if sc.isolated:
                return False, None
        return False, None

    def use(self, name: str, off: int) -> None:
        found, _ = self.lookup(name)
        if not found:
            self.err(f"{name} used but not defined in scope (regions of launch/segment/herd/func are "
                     f"isolated from above)", off)

    def define(self, name: str, ty: str | None, off: int) -> None:
        if name in self.scopes[-1].types:
            self.err(f"{name} defined twice", off)
        self.scopes[-1].types[name] = ty

    # -- module level -------------------------------------------------------------------------------------------
    def module(self, layout: mt.ModuleText) -> None:
        funcs, pos = iter(layout.funcs), 0
        for op in layout.ops:
            s = self.text.find(op, pos)
            pos = s + len(op)
            if mt.op_name(op) == "func.func":
                self.func(next(funcs), s)
                continue
            for o in air_module.read(self.text).block(s, pos):   # a channel, or the ops of a text fragment
                if o.name == "air.channel" or o.span is None:
                    self.scan(self.toks(o.start, o.end), at_module=True)
                else:
                    self.block([o])

    def func(self, f: mt.FuncOp, s: int) -> None:
        toks = self.toks(s, s + f.body[0] if f.body else s + len(f.text))
        k = parse_func(toks, 0, self.rep, self.err)
        if not (self.rep.public and self.rep.public[-1][3] == k):
            return
        name, args, types, _ = self.rep.public[-1]
        self.rep.public[-1] = (name, args, types, None)
        for ty in types:
            if memory_space(ty) not in ("", None):
                self.err(f"public func @{name} argument type {ty} must be an L3 memref (no memory space)",
                         toks[k - 1].start)
        tree = air_module.read(self.text)
        if tree.func.name != f.name:
            return
        self.scopes.append(_Scope(True, "func", dict(zip(args, types))))
        self.in_func = True
        self.block(tree.body)
        self.in_func = False
        self.scopes.pop()

    # -- ops ----------------------------------------------------------------------------------------------------
    def block(self, ops) -> None:
        for op in ops:
            if op.name in AIR_REGION_OPS:
                self.air_op(op)
            elif op.name == "scf.for" and op.span is not None:
                self.scf_for(op)
            elif op.span is not None and op.name != "air.channel":
                self.region_op(op)
            else:
                self.scan(self.toks(op.start, op.end), at_module=False)

    def air_op(self, op) -> None:
        for r in op.results:
            self.define(r, None, op.start)
        try:
            air = op.air
            if air.region is None:
                raise ValueError("no region")
        except ValueError as e:
            self.err(f"cannot parse {op.name} header: {e}", op.text_start)
            return
        types = [norm_type(tokenize(t, defs=self.defs)) for t in air.arg_types]
        attrs, attr_span = {}, None
        if air.dict_span is not None:
            a, b = op.start + air.dict_span[0], op.start + air.dict_span[1]
            attrs, _ = parse_attr_dict(self.toks(a, b), 0)
            attr_span = (a, b)
        rec = AirOp(op.name, air.symbol, ["%" + i for i in air.ids], ["%" + s for s, _ in air.sizes],
                    ["%" + v for _, v in air.sizes], ["%" + a for a, _ in air.args],
                    ["%" + o for _, o in air.args], types, attrs, attr_span,
                    (op.text_start, op.start + air.region[0] + 1), op.start + air.region[1] - 1,
                    self.air_stack[-1] if self.air_stack else None, not self.air_stack and self.in_func,
                    ["%" + d for d in air.deps])
        self.rep.air_ops.append(rec)
        _check_air_op(rec, self.lookup, self.err, self.rep)
        for v in rec.sizes + rec.operands + rec.deps:
            self.use(v, op.text_start)
        block = {a: "index" for a in rec.ids + rec.size_args}
        block.update(zip(rec.arg_names, rec.types))
        self.scopes.append(_Scope(True, rec, block))
        self.air_stack.append(rec)
        if rec.kind == "air.herd":
            self.herd_stack.append(rec)
        self.block(op.body)
        if rec.kind == "air.herd":
            self.herd_stack.pop()
        self.air_stack.pop()
        self.scopes.pop()

    def scf_for(self, op) -> None:
        for r in op.results:
            self.define(r, None, op.start)
        toks = self.toks(op.text_start, op.start + op.span[0] - 1)
        block = {toks[1].text: "index"}
        j = 3  # skip "scf.for %iv ="
        while j < len(toks):
            tk = toks[j]
            if tk.text == "iter_args":
                close = matching(toks, j + 1)
                k = j + 2
                while k < close:
                    block[toks[k].text] = None
                    self.use(toks[k + 2].text, toks[k + 2].start)
                    k += 4 if toks[k + 3].text == "," else 3
                j = close + 1
                continue
            if tk.kind == "ssa":
                self.use(tk.text, tk.start)
            j += 1
        self.scopes.append(_Scope(False, None, block))
        self.block(op.body)
        self.scopes.pop()

    def region_op(self, op) -> None:
        """An op with a region that is not isolated (linalg.generic): its head, then the block header's
        arguments and the body in a scope of their own."""
        self.scan(self.toks(op.start, op.start + op.span[0] - 1), at_module=False)
        self.scopes.append(_Scope(False, None, {}))
        label = op.block_label
        if label is not None:
            toks = self.toks(label.start(), label.end())
            close = matching(toks, 1)
            k = 2
            while k < close:
                if toks[k].kind == "ssa":
                    ty, k2 = parse_type(toks, k + 2)
                    self.scopes[-1].types[toks[k].text] = ty
                    k = k2
                else:
                    k += 1
        self.block(op.body)
        self.scopes.pop()

    def scan(self, toks: list[Tok], at_module: bool) -> None:
        """The tokens of one op without a region: definitions, uses, calls, channel ops, memref types."""
        self.rep.op_tokens.append(toks)
        i, n = 0, len(toks)
        while i < n:
            t = toks[i]
            if t.kind == "ident" and t.text == "air.channel":
                i = parse_channel_decl(toks, i, self.rep, self.err, at_module=at_module)
                continue
            if t.kind == "ident" and t.text in ("air.channel.put", "air.channel.get"):
                acc, i = parse_channel_access(toks, i, self.air_stack, self.err)
                if acc is not None:
                    self.rep.channel_ops.append(acc)
                    for v in acc.indices + [acc.buffer] + sum(acc.lists, []):
                        self.use(v, t.start)
                    found, ty = self.lookup(acc.buffer)
                    if found and ty is not None and ty != acc.type:
                        self.err(f"{t.text} on {acc.buffer}: declared type {acc.type} != its type {ty}", t.start)
                continue
            if t.text == "{":   # an attribute dictionary (regions are the tree's)
                i = matching(toks, i) + 1
                continue
            if t.kind == "ssa":
                nxt = toks[i + 1].text if i + 1 < n else ""
                if nxt == "=" or (nxt == ":" and i + 3 < n and toks[i + 2].kind == "num" and toks[i + 3].text == "="):
                    k = i + 2 if nxt == "=" else i + 4
                    self.define(t.text, result_type(toks, k) if k < n else None, t.start)
                    if k < n and toks[k].text == "memref.alloc":
                        _check_alloc(self.scopes[-1].types[t.text], self.air_stack, self.err, t.start)
                    i = k
                    continue
                self.use(t.text, t.start)
                i += 1
                continue
            if t.kind == "ident" and t.text == "func.call":
                i = self._call(toks, i)
                continue
            if t.kind == "ident" and t.text == "memref" and i + 1 < n and toks[i + 1].text == "<":
                j = matching(toks, i + 1)
                sp = memory_space(norm_type(toks[i:j + 1]))
                if sp not in ("", "1:i32", "2:i32"):
                    self.err(f"memory space of {self.text[t.start:toks[j].end]} must be absent (L3), `1 : i32` "
                             f"(L2) or `2 : i32` (L1)", t.start)
                i = j + 1
                continue
            i += 1

    def _call(self, toks: list[Tok], i: int) -> int:
        sym = toks[i + 1].text[1:]
        close = matching(toks, i + 2)
        operands = [x.text for x in toks[i + 3:close] if x.kind == "ssa"]
        for x in toks[i + 3:close]:
            if x.kind == "ssa":
                self.use(x.text, x.start)
        ftype, k = parse_type(toks, close + 2)
        self.calls.append((sym, operands, self.herd_stack[-1] if self.herd_stack else None, toks[i].start, ftype))
        return k


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
