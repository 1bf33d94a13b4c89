"""`llama-npu doctor`: every piece of an NPU setup checked, one line each, a fix for each failure.

The probes are functions over a `Machine` (a root directory for /sys, /dev, /proc, /lib/firmware and
/etc, plus a command runner with timeouts), so tests fake a whole machine. This package knows the
NPU, its driver and toolchain; what a model needs in memory comes in as a `MemoryNeed` from the
model layer (llama_npu.doctor).
"""
from __future__ import annotations

from pathlib import Path

from .kcache import check_kernel_cache
from .limits import MemoryNeed, check_host_memory, check_memlock
from .machine import CmdResult, DistInfo, Machine, run_command
from multi_launch_builder.doctor.check_report import (FAIL, OK, SKIP, SYMBOLS, Check, exit_code, fmt_bytes, ready,
                                                      render_json, render_text)
from .system import (Facts, check_device_node, check_driver, check_firmware, check_iommu, check_kernel,
                     check_npu, scan_pci)
from .pins import check_lowering_pins
from .tools import check_aiecc, check_aircc, check_peano, check_toolchain_set
from .xrt import check_pyxrt, check_xrt, check_xrt_sees_npu

CHECK_IDS = ("kernel", "driver", "npu", "firmware", "iommu", "device-node", "memlock", "host-memory", "xrt",
             "pyxrt", "xrt-smi", "aircc", "aiecc", "peano", "toolchain-set", "toolchain-pins",
             "kernel-cache")


def run_checks(machine: Machine, need: MemoryNeed | None = None, cache_dir: Path | None = None,
               decls: list | None = None) -> list[Check]:
    """Every machine check, in display order. A probe that raises is reported as its own failure
    (never a traceback)."""
    f = Facts()
    try:
        f.npus = scan_pci(machine)
    except OSError:
        f.npus = []
    # run order: host-memory reads what `xrt-smi examine` (the xrt check) printed
    probes = [
        ("kernel", lambda: check_kernel(machine, f)),
        ("driver", lambda: check_driver(machine, f)),
        ("npu", lambda: check_npu(machine, f)),
        ("firmware", lambda: check_firmware(machine, f)),
        ("iommu", lambda: check_iommu(machine, f)),
        ("device-node", lambda: check_device_node(machine, f)),
        ("memlock", lambda: check_memlock(machine, f, need)),
        ("xrt", lambda: check_xrt(machine, f)),
        ("host-memory", lambda: check_host_memory(machine, f, need)),
        ("pyxrt", lambda: check_pyxrt(machine, f)),
        ("xrt-smi", lambda: check_xrt_sees_npu(machine, f)),
        ("aircc", lambda: check_aircc(machine, f)),
        ("aiecc", lambda: check_aiecc(machine, f)),
        ("peano", lambda: check_peano(machine, f)),
        ("toolchain-set", lambda: check_toolchain_set(machine, f)),
        ("toolchain-pins", lambda: check_lowering_pins(machine, f)),
        ("kernel-cache", lambda: check_kernel_cache(machine, f, cache_dir, decls)),
    ]
    out = []
    for cid, probe in probes:
        try:
            out.append(probe())
        except Exception as e:  # a probe bug or an unreadable file must not hide the other checks
            out.append(Check(cid, cid, FAIL, f"the check itself failed: {type(e).__name__}: {e}",
                             fix="report this with the output of `llama-npu doctor --json`"))
    order = {cid: i for i, cid in enumerate(CHECK_IDS)}
    return sorted(out, key=lambda c: order.get(c.id, len(order)))


__all__ = ["CHECK_IDS", "Check", "CmdResult", "DistInfo", "FAIL", "Facts", "Machine", "MemoryNeed", "OK", "SKIP",
           "SYMBOLS", "exit_code", "fmt_bytes", "ready", "render_json", "render_text", "run_checks", "run_command"]
