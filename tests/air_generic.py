"""The AIR text in forms upstream mlir-opt-22 can parse: AIR ops rewritten into MLIR's generic op form
(`to_generic`), each herd body as a standalone func (`herd_modules`), the declarations + public signature
(`signature_module`), and `mlir_opt_verify` to run mlir-opt on them."""
from __future__ import annotations

import subprocess
import tempfile
from pathlib import Path

from air_checks import check_module
from kernel_builder import air_module
from air_parse import Report
from air_tokens import Tok, matching, parse_type_list

def to_generic(text: str, keep_calls: bool = False) -> str:
    """Rewrite AIR region ops and air.dma_memcpy_nd into MLIR generic form (parsable by upstream
    mlir-opt with --allow-unregistered-dialect); everything else is left byte-identical.

    mlir-opt stops symbol lookup at unregistered ops, so unless `keep_calls`, `func.call @f(..) : T`
    becomes `"llama_npu.extcall"(..) {callee = @f} : T` (check_module verifies calls against the
    declarations itself; herd_modules() keeps real func.calls, verified by mlir-opt)."""
    rep = check_module(text)   # walks the one AIR reader's tree; rep.op_tokens: each op's own tokens
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
    for toks in rep.op_tokens:
        edits += _dma_edits(toks)
    edits += _channel_edits(rep)
    if not keep_calls:
        for toks in rep.op_tokens:
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
    """The private declarations, verbatim (the one AIR reader's layout: kernel_builder.air_module)."""
    return [d.text for d in air_module.read(text).layout.private_decls()]


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
