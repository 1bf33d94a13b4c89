"""Merge single-kernel modules into one multi-launch module (one `func.func`, one `air.launch` per kernel).

One NPU dispatch then runs all launches in order; intermediates stay in device memory between them. The
algorithm (details and the declaration format: docs/stitching.md):

1. parse each slice (one kernel module) and wrap a bare `air.herd` in `air.launch { air.segment { herd } }`;
2. check the wiring (arity, names, types) and the data flow implied by the roles;
3. rename every SSA value, symbol and alias of slice `p` to `p_<name>` (whole tokens, strings and comments
   untouched), except the slice's external kernel symbols (`func.func private`) and its function arguments,
   which become the combined function's `%argN` chosen by the wiring;
4. emit: renamed aliases, de-duplicated private declarations, other module-level ops, then the combined
   `func.func` holding the renamed bodies in launch order.

The output is deterministic (same inputs -> byte-identical text), so it can key a compile cache.
"""
from __future__ import annotations

import re
import sys
import time
from dataclasses import dataclass
from typing import Sequence

from kernel_builder import air_module
from kernel_builder import mlir_text as mt
from multi_launch_builder.decl import ModuleDecl, Role
from multi_launch_builder.stitch_checks import check_data_flow, check_names, check_wiring

KERNEL_ATTR = "llama_npu.kernel"


@dataclass(frozen=True)
class SigArg:
    """One argument of the combined signature; `role=None` skips the role/data-flow checks for it."""

    name: str
    type: str
    role: Role | str | None = None


@dataclass(frozen=True)
class Slice:
    """One kernel module to stitch: its text and, in its canonical argument order, the combined arg names."""

    prefix: str
    text: str
    wiring: tuple[str, ...]


@dataclass
class _Kernel:
    """A parsed slice, normalised to one top-level `air.launch`."""

    slice: Slice
    module: mt.ModuleText
    params: list[tuple[str, str]]  # (ssa name, type) of the kernel's public func
    ops: list[str]                 # body ops (before `return`), dedented
    kind: str

    @property
    def label(self) -> str:
        return f"slice {self.slice.prefix!r} ({self.kind})"


# ------------------------------------------------------------------------------------------ public API

def stitch(decl: ModuleDecl) -> str:
    """Generate every launch's kernel module and stitch them into the module `decl.name`; the header records
    the declaration's aircc preset (`// aircc preset: <flags>`, read back by the hardware model)."""
    from kernel_builder.presets import PRESET_COMMENT

    signature = [SigArg(a.name, a.memref_type, a.role) for a in decl.args]
    slices = [Slice(l.prefix, l.build(), tuple(l.wiring)) for l in decl.launches]
    text = stitch_modules(decl.name, signature, slices)
    head, _, rest = text.partition("\n")
    return f"{head}\n{PRESET_COMMENT} {' '.join(decl.aircc_preset().flags())}\n{rest}"


def stitch_modules(name: str, signature: Sequence[SigArg | tuple], slices: Sequence[Slice]) -> str:
    """Stitch raw kernel-module texts. `signature` items are SigArg or (name, type[, role]) tuples."""
    sig = [a if isinstance(a, SigArg) else SigArg(*a) for a in signature]
    check_names(name, sig, slices)
    kernels = [_load(s) for s in slices]
    check_wiring(name, sig, kernels)
    if all(a.role is not None for a in sig):
        check_data_flow(name, sig, kernels)
    externs = _merge_private_decls(kernels)

    registry = _NameRegistry()
    for sym in externs:
        registry.claim("symbol", sym, ("extern", sym))
    registry.claim("symbol", name, ("module", name))
    arg_names = [f"arg{i}" for i in range(len(sig))]
    for n in arg_names:
        registry.claim("ssa", n, ("signature", n))
    index = {a.name: i for i, a in enumerate(sig)}

    aliases: list[str] = []
    others: list[str] = []
    bodies: list[list[str]] = []
    for k in kernels:
        param_map = {p: arg_names[index[w]] for (p, _), w in zip(k.params, k.slice.wiring)}
        r = _SliceRenamer(k, param_map, registry)
        aliases += [r.all(a.text) for a in k.module.aliases]
        others += [r.all(op) for op in k.module.others]
        bodies.append([r.op(op) for op in k.ops])

    out = [f"// {name}: {len(kernels)} launches stitched by multi_launch_builder.stitcher"]
    out += aliases
    out.append("module {")
    out += ["  " + _reindent(t, "  ") for t in externs.values()]
    out += ["  " + _reindent(t, "  ") for t in others]
    out.append(f"  func.func @{name}(")
    for i, a in enumerate(sig):
        comma = "," if i + 1 < len(sig) else ""
        role = f" ({Role(a.role).value})" if a.role is not None else ""
        out.append(f"      %{arg_names[i]}: {a.type}{comma}  // {a.name}{role}")
    out.append("  ) {")
    for j, (k, body) in enumerate(zip(kernels, bodies)):
        out.append(f"    // launch {j}: {k.slice.prefix} = {k.kind}({', '.join(k.slice.wiring)})")
        out += ["    " + _reindent(op, "    ") for op in body]
    out += ["    return", "  }", "}", ""]
    return "\n".join(out)


# ------------------------------------------------------------------------------------------ loading

_PARSED: dict[str, _Kernel] = {}   # kernel text -> its parse (a module repeats one kernel text per layer)


def _load(s: Slice) -> _Kernel:
    """The parsed slice; a text already parsed (the same kernel in another layer) is not parsed again."""
    hit = _PARSED.get(s.text)
    if hit is None:
        if len(_PARSED) > 512:
            _PARSED.clear()
        hit = _PARSED[s.text] = _parse(s)
    return hit if hit.slice == s else _Kernel(s, hit.module, hit.params, hit.ops, hit.kind)


def _parse(s: Slice) -> _Kernel:
    label = f"slice {s.prefix!r}"
    try:
        module = air_module.read(s.text).layout   # the one AIR reader (the hardware model reads the same tree)
    except ValueError as e:
        raise ValueError(f"{label}: cannot parse the kernel module: {e}") from None
    try:
        func = module.the_public_func()
    except ValueError as e:
        raise ValueError(f"{label}: {e}") from None
    if any(p is None for p, _ in func.params):
        raise ValueError(f"{label}: func.func @{func.name} has unnamed parameters")
    params = [(p, t) for p, t in func.params]
    ops, _ = _body_ops(func)
    kinds = [mt.op_name(op) for op in ops]
    launches = [i for i, k in enumerate(kinds) if k == "air.launch"]
    herds = [i for i, k in enumerate(kinds) if k == "air.herd"]
    if not launches and len(herds) == 1:
        ops = [_wrap_bare_herd(label, func, ops, herds[0])]
        launches, kinds = [0], ["air.launch"]
    elif len(launches) != 1 or herds:
        raise ValueError(f"{label}: expected exactly one top-level air.launch (or one bare air.herd) in "
                         f"@{func.name}, found {len(launches)} launch(es) and {len(herds)} herd(s)")
    launch = mt.parse_air_op(ops[launches[0]])
    attr = launch.attributes.get(KERNEL_ATTR)
    if not isinstance(attr, dict) or not isinstance(attr.get("kind"), str):
        raise ValueError(f"{label}: the air.launch has no `{KERNEL_ATTR} = {{kind = \"...\", ...}}` attribute")
    # The emulator binds a launch's operands in `args(...)` order to the kernel's canonical arguments,
    # so that order must be exactly the function's parameter order.
    operands = [o for _, o in launch.args]
    if operands != [p for p, _ in params]:
        raise ValueError(f"{label}: the air.launch args must pass the function arguments in canonical order "
                         f"({', '.join('%' + p for p, _ in params)}), found ({', '.join('%' + o for o in operands)})")
    for (p, t), lt in zip(params, launch.arg_types):
        if mt.normalize(t) != mt.normalize(lt):
            raise ValueError(f"{label}: air.launch operand %{p} has type {lt} but the parameter is {t}")
    return _Kernel(s, module, params, ops, attr["kind"])


def _body_ops(func: mt.FuncOp) -> tuple[list[str], str]:
    """Body ops with their continuation lines dedented to the op's own column."""
    text = func.text
    spans = mt.split_ops(text, *func.body, comments=True)  # comment lines travel with the ops
    ops = []
    for s, e in spans:
        col = s - (text.rfind("\n", 0, s) + 1)
        ops.append(_dedent_continuation(text[s:e], col))
    while ops and mt.is_comment(ops[-1]):
        ops.pop()
    if not ops or mt.op_name(ops[-1]) not in ("return", "func.return"):
        raise ValueError(f"func.func @{func.name}: body does not end with `return`")
    return ops[:-1], ops[-1]


def _dedent_continuation(op: str, col: int) -> str:
    if "\n" not in op or col == 0:
        return op
    lines = op.split("\n")
    pad = " " * col
    return "\n".join([lines[0]] + [ln[col:] if ln.startswith(pad) else ln.lstrip() for ln in lines[1:]])


def _reindent(op: str, pad: str) -> str:
    return op.replace("\n", "\n" + pad) if "\n" in op else op


def _fresh(base: str, taken: set[str]) -> str:
    name = base
    while name in taken:
        name += "_"
    taken.add(name)
    return name


def _wrap_bare_herd(label: str, func: mt.FuncOp, ops: list[str], herd_at: int) -> str:
    """`herd` -> `air.launch () in () args(...) attrs { air.segment @.. args(...) { <body ops> } }`.

    AIR only schedules herds that sit in a segment inside a launch (airrt-to-npu sees segment_load ops).
    The launch/segment are isolated from above, so the whole function body (the constants feeding the herd's
    sizes included) moves inside, and the function arguments are threaded through launch and segment args.
    The `llama_npu.kernel` attribute moves to the launch; everything else (link_with ...) stays on the herd."""
    herd = mt.parse_air_op(ops[herd_at])
    if herd.dict_span is None:
        raise ValueError(f"{label}: the bare air.herd has no `{KERNEL_ATTR}` attribute")
    entries = mt.attr_dict_entries(herd.text[slice(*herd.dict_span)])
    moved = [e for k, e in entries if k == KERNEL_ATTR]
    if not moved:
        raise ValueError(f"{label}: the bare air.herd has no `{KERNEL_ATTR}` attribute")
    kept = [e for k, e in entries if k != KERNEL_ATTR]
    a0, a1 = herd.attr_span
    new_attrs = f" attributes {{{', '.join(kept)}}}" if kept else ""
    ops = list(ops)
    ops[herd_at] = herd.text[:a0].rstrip() + new_attrs + " " + herd.text[a1:].lstrip()

    taken = mt.names_in(func.text)
    ssa_taken, sym_taken = set(taken["ssa"]), set(taken["symbol"])
    launch_args = [_fresh(f"launch_arg{i}", ssa_taken) for i in range(len(func.params))]
    seg_args = [_fresh(f"segment_arg{i}", ssa_taken) for i in range(len(func.params))]
    seg_sym = _fresh(f"{herd.symbol or 'herd'}_segment", sym_taken)
    to_seg = {p: s for (p, _), s in zip(func.params, seg_args)}
    inner = [_rename_outside_regions(op, lambda n: to_seg.get(n)) for op in ops]
    types = ", ".join(t for _, t in func.params)
    l_args = ", ".join(f"%{a}=%{p}" for a, (p, _) in zip(launch_args, func.params))
    s_args = ", ".join(f"%{s}=%{a}" for s, a in zip(seg_args, launch_args))
    body = "\n".join("    " + _reindent(op, "    ") for op in inner)
    return (f"air.launch () in () args({l_args}) : {types} attributes {{{moved[0]}}} {{\n"
            f"  air.segment @{seg_sym} args({s_args}) : {types} {{\n{body}\n  }}\n}}")


def _rename_outside_regions(op: str, ssa) -> str:
    """Rename SSA uses in an op, but not inside the region of an AIR launch/segment/herd: those regions are
    isolated from above, so a name there may be a local value that merely shares a function argument's name."""
    if mt.op_name(op) in mt.AIR_REGION_OPS:
        air = mt.parse_air_op(op)
        if air.region is not None:
            return mt.rename(op[:air.region[0]], ssa=ssa) + op[air.region[0]:]
    return mt.rename(op, ssa=ssa)


def _merge_private_decls(kernels: list[_Kernel]) -> dict[str, str]:
    """Identical `func.func private` declarations are emitted once; two different ones for one symbol fail."""
    out: dict[str, str] = {}
    owner: dict[str, tuple[str, tuple]] = {}
    for k in kernels:
        for d in k.module.private_decls():
            key = (tuple(mt.normalize(t) for _, t in d.params), tuple(mt.normalize(r) for r in d.results),
                   mt.normalize(d.attr_text or ""))
            if d.name in owner:
                first, first_key = owner[d.name]
                if first_key != key:
                    raise ValueError(f"private function @{d.name} is declared differently by {first} and "
                                     f"{k.label}:\n  {out[d.name]}\n  {mt.strip_comments(d.text).strip()}")
                continue
            owner[d.name] = (k.label, key)
            out[d.name] = mt.strip_comments(d.text).strip()
    return out


# ------------------------------------------------------------------------------------------ renaming

class _NameRegistry:
    """Every name emitted into the combined module, with where it came from; a second origin is a collision
    (e.g. prefix `q` + `k_0` vs prefix `q_k` + `0`), reported instead of silently merging two values."""

    def __init__(self) -> None:
        self.origin: dict[tuple[str, str], tuple[str, str]] = {}

    def claim(self, kind: str, new: str, origin: tuple[str, str]) -> str:
        prev = self.origin.setdefault((kind, new), origin)
        if prev != origin:
            raise ValueError(f"stitching: renaming maps two different names to {kind} {new!r}: "
                             f"{prev[1]!r} from {prev[0]} and {origin[1]!r} from {origin[0]}; rename a slice prefix")
        return new


class _SliceRenamer:
    def __init__(self, k: _Kernel, param_map: dict[str, str], registry: _NameRegistry):
        p, label = k.slice.prefix, k.label
        externs = {d.name for d in k.module.private_decls()}
        attr_aliases = {a.name for a in k.module.aliases if a.sigil == "#"}
        type_aliases = {a.name for a in k.module.aliases if a.sigil == "!"}
        claim = registry.claim

        def local(kind):
            return lambda n: claim(kind, f"{p}_{n}", (label, n))

        self._ssa_local = local("ssa")
        self._ssa_param = lambda n: param_map[n] if n in param_map else self._ssa_local(n)
        self._sym = lambda n: None if n in externs else claim("symbol", f"{p}_{n}", (label, n))
        self._attr = lambda n: claim("attr_alias", f"{p}_{n}", (label, n)) if n in attr_aliases else None
        self._type = lambda n: claim("type_alias", f"{p}_{n}", (label, n)) if n in type_aliases else None

    def all(self, text: str) -> str:
        """Module-level text (aliases, channels): no function arguments in scope."""
        return mt.rename(text, ssa=self._ssa_local, symbol=self._sym, attr_alias=self._attr,
                         type_alias=self._type)

    def op(self, op: str) -> str:
        """A body op: function arguments are in scope, except inside isolated AIR regions."""
        if mt.op_name(op) in mt.AIR_REGION_OPS:
            region = mt.parse_air_op(op).region
            if region is not None:
                head = mt.rename(op[:region[0]], ssa=self._ssa_param, symbol=self._sym,
                                 attr_alias=self._attr, type_alias=self._type)
                return head + self.all(op[region[0]:])
        return mt.rename(op, ssa=self._ssa_param, symbol=self._sym, attr_alias=self._attr,
                         type_alias=self._type)


# ------------------------------------------------------------------------------------------ benchmark

def bench_stitch(decls, verbose: bool = False) -> float:
    """Seconds to generate (kernel memo cleared) and stitch the given declarations (`make bench`)."""
    from kernel_builder.registry import clear_kernel_cache

    clear_kernel_cache()
    t0 = time.perf_counter()
    for decl in decls:
        t = time.perf_counter()
        text = stitch(decl)
        if verbose:
            print(f"  {decl.name:24s} {len(decl.launches):2d} launches {len(text):9d} chars "
                  f"{time.perf_counter() - t:6.3f} s", file=sys.stderr)
    return time.perf_counter() - t0
