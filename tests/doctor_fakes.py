"""A fake machine for `llama-npu doctor` tests: a tmp tree standing in for /sys, /dev, /proc,
/lib/firmware, /etc and /opt, canned outputs for the probed commands, a fake toolchain and wheel
metadata. `healthy(tmp_path)` is a complete NPU2 setup; tests break one piece each."""
from __future__ import annotations

import os
import shutil
from pathlib import Path

from multi_launch_builder.doctor import CmdResult, DistInfo, Machine
from kernel_builder.toolchain import Toolchain

RELEASE = "6.14.0-15-generic"
BDF = "0000:c5:00.1"
USER, UID = "alice", 4242   # not the uid running the tests: group bits decide access
MIB, GIB = 1 << 20, 1 << 30
AIR_WHEEL, AIE_WHEEL = "0.0.1.2026050104+efeb41c", "0.0.1.2026041305+ae8ed9d"

EXAMINE = """System Configuration
  OS Name              : Linux
  Release              : {release}
  Version              : #15-Ubuntu SMP PREEMPT_DYNAMIC
  Memory               : 31744 MB

XRT
  Version              : {xrt}
  Branch               : HEAD
  amdxdna              : {xrt}_20250330, 7c1d273ef9946848a9f236f1216cfda10d9465cb
  NPU Firmware Version : 1.0.0.63

Device(s) Present
|BDF             |Name          |
|----------------|--------------|
{rows}
"""
TARGETS = """  Registered Targets:
    aie        - AIE
    aie2       - Xilinx AIML Engine
    aie2p      - AMD AIE2p Engine
    x86-64     - 64-bit X86: EM64T and AMD64
"""


def examine(xrt: str = "2.19.0", devices=((BDF, "NPU Strix"),)) -> str:
    rows = "\n".join(f"|[{b}]  |{n}  |" for b, n in devices) if devices else "  0 devices found"
    return EXAMINE.format(release=RELEASE, xrt=xrt, rows=rows)


def write(root: Path, path: str, text: str = "") -> Path:
    p = root / path.lstrip("/")
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text)
    return p


def remove(root: Path, path: str) -> None:
    p = root / path.lstrip("/")
    if p.is_symlink() or p.is_file():
        p.unlink()
    elif p.is_dir():
        shutil.rmtree(p)


class FakeRunner:
    """argv -> CmdResult from a table keyed by '<basename> <args>' ('import pyxrt' for the pyxrt probe).
    A value is stdout text, a CmdResult, or "HANG" (timed out). Unknown commands are not found."""

    def __init__(self, table: dict):
        self.table = dict(table)
        self.calls: list[tuple[str, ...]] = []

    def __call__(self, argv, timeout):
        argv = tuple(argv)
        self.calls.append(argv)
        key = "import pyxrt" if any("import pyxrt" in a for a in argv) else " ".join(
            [os.path.basename(argv[0]), *argv[1:]])
        val = self.table.get(key)
        if val is None:
            return CmdResult(argv, None, failure="FileNotFoundError")
        if val == "HANG":
            return CmdResult(argv, None, failure="TimeoutExpired", timed_out=True, timeout_s=timeout)
        if isinstance(val, CmdResult):
            return val
        return CmdResult(argv, 0, val, "")


class FakeMachine:
    """Builds the tree and the fakes; `.machine()` returns a Machine over them."""

    def __init__(self, root: Path):
        self.root = root
        self.gid = os.getgid()
        self.gids = {self.gid}
        self.toolchain = Toolchain(aircc="/venv/lib/mlir_air/bin/aircc", aiecc="/venv/lib/mlir_aie/bin/aiecc",
                                   peano="/venv/lib/llvm-aie")
        self.dists = {
            # wheels built at the pinned commits (kernel_builder/toolchain_pins.py)
            "mlir_air": DistInfo("mlir_air", AIR_WHEEL,
                                 ('filelock==3.13.1', f'mlir_aie=={AIE_WHEEL}; extra == "aie"',
                                  'llvm-aie; extra == "aie"')),
            "mlir_aie": DistInfo("mlir_aie", AIE_WHEEL),
            "llvm-aie": DistInfo("llvm-aie", "19.0.0.2026040101+deadbeef"),
        }
        self.commands = {
            "xrt-smi examine": examine(),
            "import pyxrt": "/opt/xilinx/xrt/python/pyxrt.cpython-312-x86_64-linux-gnu.so\n",
            "aircc --version": "aircc 0.0.1 (mlir-air efeb41c)\n",
            "aiecc --version": "aiecc 0.0.1\n",
            "clang --version": "clang version 19.0.0 (llvm-aie deadbeef)\nTarget: x86_64-unknown-linux-gnu\n",
            "clang --print-targets": TARGETS,
        }
        self.timeout_s = 5.0
        self.runner = None

    def machine(self) -> Machine:
        self.runner = FakeRunner(self.commands)
        return Machine(root=self.root, env={"PATH": str(self.root / "no-bin")}, uid=UID,
                       gids=frozenset(self.gids), user=USER, python="/venv/bin/python", timeout_s=self.timeout_s,
                       runner=self.runner, toolchain=lambda: self.toolchain, dist=self.dists.get)

    # ---------------------------------------------------------------- pieces
    def set_pci(self, device: int = 0x17F0, revision: int = 0x10, bound: bool = True) -> None:
        d = f"/sys/bus/pci/devices/{BDF}"
        write(self.root, f"{d}/vendor", "0x1022\n")
        write(self.root, f"{d}/device", f"0x{device:04x}\n")
        write(self.root, f"{d}/revision", f"0x{revision:02x}\n")
        write(self.root, f"{d}/class", "0x118000\n")
        link = self.root / d.lstrip("/") / "driver"
        if link.is_symlink():
            link.unlink()
        if not bound:
            remove(self.root, f"{d}/vbnv")
            remove(self.root, f"{d}/fw_version")
        if bound:
            drv = self.root / "sys/bus/pci/drivers/amdxdna"
            drv.mkdir(parents=True, exist_ok=True)
            link.symlink_to(drv)
            write(self.root, f"{d}/vbnv", "NPU Strix\n")
            write(self.root, f"{d}/fw_version", "1.0.0.63\n")

    def set_accel(self, present: bool = True, mode: int = 0o660) -> None:
        acc = self.root / "sys/class/accel/accel0"
        acc.mkdir(parents=True, exist_ok=True)
        if not (acc / "device").is_symlink():
            (acc / "device").symlink_to(self.root / f"sys/bus/pci/devices/{BDF}")
        node = self.root / "dev/accel/accel0"
        if present:
            write(self.root, "/dev/accel/accel0")
            node.chmod(mode)
        else:
            remove(self.root, "/dev/accel/accel0")

    def unload_driver(self, installed: bool = False, release: str = RELEASE) -> None:
        write(self.root, "/proc/modules", "snd_hda_intel 61440 3 - Live 0x0000000000000000\n")
        remove(self.root, "/sys/module/amdxdna")
        dep = "kernel/drivers/accel/amdxdna/amdxdna.ko.zst: kernel/drivers/gpu/drm/drm.ko.zst\n" if installed else \
            "kernel/sound/pci/hda/snd-hda-intel.ko.zst:\n"
        write(self.root, f"/lib/modules/{release}/modules.dep", dep)
        write(self.root, f"/lib/modules/{release}/modules.builtin", "kernel/drivers/base/firmware_loader.ko\n")
        self.set_pci(bound=False)
        remove(self.root, "/sys/class/accel")
        remove(self.root, "/dev/accel")

    def set_memlock(self, soft: str, hard: str) -> None:
        write(self.root, "/proc/self/limits",
              "Limit                     Soft Limit           Hard Limit           Units     \n"
              "Max cpu time              unlimited            unlimited            seconds   \n"
              f"Max locked memory         {soft:<20} {hard:<20} bytes     \n")

    def set_meminfo(self, total: int, available: int) -> None:
        write(self.root, "/proc/meminfo", f"MemTotal:       {total // 1024} kB\nMemFree:        {available // 2048} kB\n"
                                          f"MemAvailable:   {available // 1024} kB\n")


def healthy(tmp_path: Path) -> FakeMachine:
    """A complete NPU2 (Strix) setup: in-tree amdxdna on 6.14, firmware, IOMMU, accessible node,
    unlimited memlock, 32 GiB RAM, XRT 2.19, pyxrt, aircc/aiecc/Peano from a pinned wheel set."""
    root = tmp_path / "machine"
    fm = FakeMachine(root)
    write(root, "/proc/sys/kernel/osrelease", RELEASE + "\n")
    write(root, "/proc/modules", "amdxdna 155648 0 - Live 0x0000000000000000\nsnd 61440 3 - Live 0x0\n")
    write(root, f"/lib/modules/{RELEASE}/modules.dep",
          "kernel/drivers/accel/amdxdna/amdxdna.ko.zst: kernel/drivers/gpu/drm/drm.ko.zst\n")
    write(root, f"/lib/modules/{RELEASE}/modules.builtin", "kernel/drivers/base/firmware_loader.ko\n")
    (root / "sys/module/amdxdna").mkdir(parents=True)
    fm.set_pci()
    fm.set_accel()
    write(root, "/lib/firmware/amdnpu/17f0_10/npu.sbin.zst", "fw")
    (root / "sys/class/iommu/ivhd0").mkdir(parents=True)
    write(root, "/proc/cmdline", f"BOOT_IMAGE=/boot/vmlinuz-{RELEASE} root=UUID=1 ro quiet splash\n")
    fm.set_memlock("unlimited", "unlimited")
    write(root, "/proc/self/status", "Name:\tpython\nCapEff:\t0000000000000000\n")
    fm.set_meminfo(32 * GIB, 28 * GIB)
    fm.gid = (root / "dev/accel/accel0").stat().st_gid
    fm.gids = {fm.gid}
    write(root, "/etc/passwd", f"root:x:0:0::/root:/bin/bash\n{USER}:x:{UID}:{UID}::/home/{USER}:/bin/bash\n")
    groups = {fm.gid: "render", UID: USER, **({0: "root"} if fm.gid != 0 else {})}
    write(root, "/etc/group", "".join(f"{name}:x:{gid}:\n" for gid, name in groups.items()))
    write(root, "/opt/xilinx/xrt/bin/xrt-smi", "#!/bin/sh\n")
    return fm
