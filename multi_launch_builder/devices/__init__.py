"""Devices behind one interface (base.Device): npu (pyxrt), emu (software), emu-interp
(software, interpreting the AIR herds/DMAs), null (counting)."""
from __future__ import annotations

from .base import Artifact, Buffer, Device, DeviceRunError, DeviceStats


def make_device(name: str | None = "auto", **kwargs) -> Device:
    """`auto` (or None: honour $DEVICE) -> npu when the whole toolchain and an NPU are present,
    else emu with a one-line notice; `npu` without them raises toolchain.ToolchainMissing."""
    from kernel_builder.toolchain import resolve_device_kind
    kind = resolve_device_kind(name)
    if kind == "npu":
        from .npu import NpuDevice
        return NpuDevice(**kwargs)
    if kind == "emu":
        from .emu import EmuDevice
        return EmuDevice(**kwargs)
    if kind == "emu-interp":
        from .interp import InterpEmuDevice
        return InterpEmuDevice(**kwargs)
    from .null import NullDevice
    return NullDevice(**kwargs)


__all__ = ["Artifact", "Buffer", "Device", "DeviceRunError", "DeviceStats", "make_device"]
