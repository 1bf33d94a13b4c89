"""Structure checks for the MLIR-AIR text our builders and the stitcher generate.

mlir-opt-22 cannot parse the AIR dialect's custom syntax, so these test helpers
  * scan the text with a small tokenizer + balanced-bracket walker and check what AIR would check
    (SSA scoping with isolated launch/segment/herd regions, `args(...)` vs `: types`, bound value types,
    memory spaces, external calls vs declarations and `link_with`, the `llama_npu.kernel` attribute): this
    module, with air_tokens (tokenizer, types, attributes) and air_parse (single constructs, the Report), and
  * rewrite the AIR ops into MLIR's *generic* op form (`"air.herd"(...) ({ ^bb0(...): ... }) {...} : ...`)
    so mlir-opt-22 --allow-unregistered-dialect can parse/verify everything else (types, func.call
    signatures, linalg/scf/arith/memref ops): air_generic. `air_generic.herd_modules()` additionally extracts
    each herd body into a standalone func taking the herd's block arguments as parameters.

Usage: `report = check_module(text)`; `report.errors` is empty for a valid module; `report.kernels` lists the
`llama_npu.kernel` attributes of the launches / bare herds in order.
"""
from __future__ import annotations

from air_parse import (AirOp, Report, parse_air_header, parse_channel_access, parse_channel_decl, parse_func,
                       result_type)
from air_tokens import Tok, is_attr_dict, matching, memory_space, norm_type, parse_type, tokenize

AIR_REGION_OPS = ("air.launch", "air.segment", "air.herd")


class _Scope:
    def __init__(self, isolated: bool, owner=None, types: dict | None = None):
        self.isolated = isolated
        self.owner = owner  # AirOp / "func" / None
        self.types: dict[str, str | None] = dict(types or {})


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
            i = parse_channel_decl(toks, i, rep, err, at_module=(func_depth == 0 and len(scopes) <= 2))
            continue
        if t.kind == "ident" and t.text in ("air.channel.put", "air.channel.get"):
            acc, i = parse_channel_access(toks, i, air_stack, err)
            if acc is not None:
                rep.channel_ops.append(acc)
                for v in acc.indices + [acc.buffer] + sum(acc.lists, []):
                    use(Tok("ssa", v, t.start, t.start))
                found, ty = lookup(acc.buffer)
                if found and ty is not None and ty != acc.type:
                    err(f"{t.text} on {acc.buffer}: declared type {acc.type} != its type {ty}", t.start)
            continue
        if t.kind == "ident" and t.text == "func.func":
            i = parse_func(toks, i, rep, err)
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
            op, i = parse_air_header(toks, i, parent, func_level=(not air_stack and func_depth > 0))
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
            if pending is None and is_attr_dict(toks, i):
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
                scopes[-1].types[t.text] = result_type(toks, k) if k < n else None
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
