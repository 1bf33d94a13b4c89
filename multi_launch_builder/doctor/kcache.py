"""The compiled-kernel cache: which modules are built for which toolchain, and which are stale.

A module's manifest entry records the toolchain `versions` it was built with (docs/cache.md); an entry
whose versions differ from the detected toolchain's is rebuilt by the next `llama-npu compile`. With
the model's declarations, each module's key is also recomputed (generate + stitch, no compile), so a
module built for other shapes or by an older builder counts as stale too.
"""
from __future__ import annotations

import json
from pathlib import Path

from multi_launch_builder.compile import entry_valid, module_keys, read_manifest
from .machine import Machine
from multi_launch_builder.doctor.check_report import FAIL, OK, SKIP, Check
from .system import Facts
from .tools import detected_versions


def _names(names: list[str], limit: int = 5) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f" (+{len(names) - limit} more)" if len(names) > limit else "")


def _versions_text(v: dict | None) -> str:
    if not isinstance(v, dict) or not v:
        return "unknown toolchain"
    return " / ".join(f"{k} {v[k]}" for k in ("aircc", "aiecc", "peano") if k in v) or json.dumps(v)


def _diff(old, new: dict) -> str:
    if not isinstance(old, dict):
        return "no recorded versions"
    keys = [k for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k)]
    return "; ".join(f"{k}: {old.get(k, '-')!r} -> {new.get(k, '-')!r}" for k in keys[:2])


def check_kernel_cache(m: Machine, f: Facts, cache_dir: Path | None, decls: list | None = None) -> Check:
    if cache_dir is None:
        return Check("kernel-cache", "kernel cache", SKIP, "no cache directory given")
    cache_dir = Path(cache_dir)
    targets = read_manifest(cache_dir)["targets"]
    npu, emu = targets.get("npu", {}), targets.get("emu", {})
    emu_txt = f"; emu: {len(emu)} module(s)" if emu else ""
    data = {"cache_dir": str(cache_dir), "npu_modules": sorted(npu), "emu_modules": sorted(emu)}
    if not npu:
        return Check("kernel-cache", "kernel cache", SKIP,
                     f"no NPU modules built yet in {cache_dir} (`make compile DEVICE=npu` builds them){emu_txt}",
                     data=data)
    expected = detected_versions(m)
    if expected is None:
        by_tc: dict[str, list[str]] = {}
        for name, e in sorted(npu.items()):
            by_tc.setdefault(_versions_text(e.get("versions")), []).append(name)
        built = "; ".join(f"{len(v)} with {k}" for k, v in by_tc.items())
        return Check("kernel-cache", "kernel cache", SKIP,
                     f"npu: {built}; the toolchain is incomplete, so they cannot be judged{emu_txt}", data=data)
    stale = {n: _diff(e.get("versions"), expected) for n, e in sorted(npu.items()) if e.get("versions") != expected}
    outdated, missing = [], []
    if decls:
        wanted = [d for d in decls if d.name in npu and d.name not in stale]
        keys = module_keys(wanted, "npu", expected)
        outdated = [d.name for d in wanted if not entry_valid(cache_dir, npu[d.name], keys[d.name])]
        missing = [d.name for d in decls if d.name not in npu]
    data.update({"stale": sorted(stale), "outdated": outdated, "not_built": missing, "toolchain": expected})
    if stale or outdated:
        parts = []
        if stale:
            first = next(iter(stale))
            parts.append(f"{len(stale)} built with another toolchain ({_names(list(stale))}; {stale[first]})")
        if outdated:
            parts.append(f"{len(outdated)} built from other shapes or builders ({_names(outdated)})")
        return Check("kernel-cache", "kernel cache", FAIL, "npu: " + "; ".join(parts) + emu_txt,
                     fix="`make compile DEVICE=npu` rebuilds exactly these (the first NPU run would do it too, "
                         "at start-up)",
                     anchor="running", blocking=False, data=data)
    current = len(npu) - len(stale)
    tail = f"; {len(missing)} of the model's modules not built yet" if missing else ""
    return Check("kernel-cache", "kernel cache", OK,
                 f"npu: {current} module(s) current for {_versions_text(expected)}{tail}{emu_txt}", data=data)
