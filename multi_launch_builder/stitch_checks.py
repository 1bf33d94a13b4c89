"""The stitcher's checks of a declaration before any text is emitted: names and prefixes, the wiring (arity,
argument names, types with each kernel module's aliases expanded) and the data flow implied by the roles. Each
raises one ValueError naming the module, the slice and the argument (docs/stitching.md). `sig` holds the
stitcher's SigArg items, `slices` its Slices, `kernels` its parsed slices (duck-typed: this module does not import
the stitcher)."""
from __future__ import annotations

import re
from typing import Sequence

from kernel_builder import mlir_text as mt
from kernel_builder.registry import signature
from multi_launch_builder.decl import Role

_PREFIX_RE = re.compile(r"[A-Za-z][A-Za-z0-9_]*")
_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_$.]*")


def check_names(name: str, sig: list, slices: Sequence) -> None:
    if not _NAME_RE.fullmatch(name):
        raise ValueError(f"module name {name!r} is not a valid MLIR symbol name")
    seen: set[str] = set()
    for a in sig:
        if a.name in seen:
            raise ValueError(f"module {name}: duplicate argument name {a.name!r}")
        seen.add(a.name)
        if a.role is not None:
            Role(a.role)  # ValueError for an unknown role
    if not slices:
        raise ValueError(f"module {name}: no launches to stitch")
    prefixes: set[str] = set()
    for s in slices:
        if not _PREFIX_RE.fullmatch(s.prefix):
            raise ValueError(f"module {name}: slice prefix {s.prefix!r} must match {_PREFIX_RE.pattern}")
        if s.prefix in prefixes:
            raise ValueError(f"module {name}: two slices use the prefix {s.prefix!r}")
        prefixes.add(s.prefix)


_ALIAS_USE = re.compile(r"(?<![\w.$-])([!#][A-Za-z_][\w.$-]*)")


def _expand_aliases(ty: str, k) -> str:
    """`ty` with the kernel module's own `!type` / `#attr` aliases replaced by their definitions, so a
    kernel signature written with aliases compares equal to the spelled-out combined signature."""
    defs = {f"{a.sigil}{a.name}": a.text.split("=", 1)[1].strip() for a in k.module.aliases if "=" in a.text}
    if not defs:
        return ty
    for _ in range(16):  # aliases may use earlier aliases; bounded against cycles
        new = _ALIAS_USE.sub(lambda m: defs.get(m[1], m[1]), ty)
        if new == ty:
            break
        ty = new
    return ty


def check_wiring(name: str, sig: list, kernels: list) -> None:
    types = {a.name: a.type for a in sig}
    for k in kernels:
        w = k.slice.wiring
        if len(w) != len(k.params):
            raise ValueError(f"module {name}, {k.label}: wiring names {len(w)} arguments {list(w)} but the "
                             f"kernel takes {len(k.params)} ({', '.join(t for _, t in k.params)})")
        for pos, ((p, t), arg) in enumerate(zip(k.params, w)):
            if arg not in types:
                raise ValueError(f"module {name}, {k.label}: kernel argument {pos} (%{p}) is wired to {arg!r}, "
                                 f"which is not an argument of the module (arguments: {', '.join(types)})")
            if mt.normalize(_expand_aliases(t, k)) != mt.normalize(types[arg]):
                raise ValueError(f"module {name}, {k.label}: kernel argument {pos} (%{p}) has type {t} but "
                                 f"module argument {arg!r} has type {types[arg]}")
    used = {a for k in kernels for a in k.slice.wiring}
    for a in sig:
        if a.name not in used:
            raise ValueError(f"module {name}: argument {a.name!r} is not used by any slice")


def check_data_flow(name: str, sig: list, kernels: list) -> None:
    """What a kernel writes comes from its signature (kernel_builder.registry.SIGNATURES: outputs, and
    in-place arguments that it reads and writes). Inputs/statics/scalars are never written; each
    output/intermediate is produced by exactly one slice, before any slice reads (or updates) it; STATE
    windows are persistent memory: any slice may read or update them, in launch order."""
    writers: dict[str, list[int]] = {a.name: [] for a in sig}
    readers: dict[str, list[int]] = {a.name: [] for a in sig}
    updaters: dict[str, list[int]] = {a.name: [] for a in sig}
    for j, k in enumerate(kernels):
        ks = signature(k.kind, len(k.slice.wiring))
        for pos, arg in enumerate(k.slice.wiring):
            pname = ks.args[pos]
            if pname in ks.inplace:
                updaters[arg].append(j)
                readers[arg].append(j)
            elif pname in ks.writes:
                writers[arg].append(j)
            else:
                readers[arg].append(j)
    label = [k.label for k in kernels]
    roles = {a.name: Role(a.role) for a in sig}
    produced = [a.name for a in sig if roles[a.name] in (Role.OUTPUT, Role.INTERMEDIATE)]
    # Most specific problems first, so a single mistake is reported as itself.
    for a in sig:
        if roles[a.name] in (Role.INPUT, Role.STATIC, Role.SCALAR) and (writers[a.name] or updaters[a.name]):
            j = (writers[a.name] or updaters[a.name])[0]
            raise ValueError(f"module {name}, {label[j]}: writes argument {a.name!r}, but {a.name!r} has role "
                             f"{roles[a.name].value}")
    for n in produced:
        if len(writers[n]) > 1:
            w = writers[n]
            raise ValueError(f"module {name}: argument {n!r} is written by two slices: {label[w[0]]} and {label[w[1]]}")
    for n in produced:
        if not writers[n]:
            raise ValueError(f"module {name}: argument {n!r} has role {roles[n].value} but no slice writes it")
    for n in produced:
        w = writers[n][0]
        for j in readers[n]:
            if j == w:
                raise ValueError(f"module {name}, {label[j]}: reads and writes argument {n!r} through two "
                                 "parameters (only a kernel's in-place parameters may do that)")
            if j < w:
                raise ValueError(f"module {name}, {label[j]}: reads {roles[n].value} {n!r} before "
                                 f"{label[w]} writes it")
    for n in produced:
        if roles[n] is Role.INTERMEDIATE and not readers[n]:
            raise ValueError(f"module {name}: intermediate {n!r} is written by {label[writers[n][0]]} but never "
                             "read (declare it as an output?)")
