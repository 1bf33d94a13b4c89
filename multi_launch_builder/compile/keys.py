"""What a module's build-cache key hashes: the stitched text, the external kernels it links (each one's
fingerprint: source, headers, defines, Peano flags), its aircc preset (npu), the toolchain versions and
BUILD_FORMAT. emu and null share one target (`emu`); npu artifacts live apart."""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

from kernel_builder import air_module
from kernel_builder.toolchain import DEVICE_KINDS

BUILD_FORMAT = 1


@dataclass(frozen=True)
class ExternalRef:
    obj: str                       # object file named by link_with
    kernel: object | None          # externals.ExternalKernel that builds it (None: unknown object)
    fingerprint: str


def _kernel_for_object(obj: str):
    """Map a link_with object name to the ExternalKernel that produces it (None if unknown)."""
    from kernel_builder.externals import kernel_for_object
    return kernel_for_object(obj)


def _fallback_fingerprint(obj: str) -> str:
    """Unknown object: hash the .cc sources whose stem starts the object name (plus headers)."""
    from external_kernels.paths import SOURCE_DIR
    h = hashlib.sha256(obj.encode())
    stem = obj.split(".")[0]
    for p in sorted(SOURCE_DIR.glob("*.cc")) + sorted(SOURCE_DIR.glob("*.h")):
        if p.suffix == ".h" or stem.startswith(p.stem):
            h.update(p.name.encode() + b"\0" + p.read_bytes())
    return "unknown:" + h.hexdigest()


def externals_for_text(text: str) -> list[ExternalRef]:
    """Every distinct `link_with = "x.o"` object of a module text's declarations (the one AIR reader's tree:
    kernel_builder.air_module), with its kernel and fingerprint."""
    from external_kernels.compile_rules import kernel_fingerprint
    refs = []
    for obj in air_module.read(text).link_objects:
        try:
            kernel = _kernel_for_object(obj)
        except ValueError:
            kernel = None
        fp = kernel_fingerprint(kernel) if kernel is not None else _fallback_fingerprint(obj)
        refs.append(ExternalRef(obj, kernel, fp))
    return refs


def target_of(device_kind: str) -> str:
    """emu and null run the same artifact (the stitched text), so they share one cache target."""
    if device_kind not in DEVICE_KINDS:
        raise ValueError(f"unknown device kind {device_kind!r}; expected one of {DEVICE_KINDS}")
    return "npu" if device_kind == "npu" else "emu"


def module_key(text: str, externals: list[ExternalRef], target: str, versions: dict,
               preset_flags: list[str]) -> str:
    h = hashlib.sha256()
    blob = {"build_format": BUILD_FORMAT, "target": target, "versions": versions,
            "preset": preset_flags if target == "npu" else [],
            "externals": [[r.obj, r.fingerprint] for r in externals]}
    h.update(json.dumps(blob, sort_keys=True).encode())
    h.update(b"\0")
    h.update(text.encode())
    return h.hexdigest()
