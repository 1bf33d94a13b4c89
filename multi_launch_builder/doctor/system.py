"""Kernel, amdxdna driver, NPU PCI device, firmware, IOMMU and /dev/accel node, read from sysfs /
procfs / the firmware tree the way the driver and the kernel see them (sources in docs/npu-setup.md,
"What `make doctor` checks").
"""
from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path

from .machine import Machine
from multi_launch_builder.doctor.check_report import FAIL, OK, SKIP, Check

AMD_VENDOR = 0x1022
MIN_INTREE_KERNEL = (6, 14)     # CONFIG_DRM_ACCEL_AMDXDNA is in mainline Linux from 6.14


@dataclass(frozen=True)
class NpuModel:
    xdna_name: str          # the amdxdna driver's name for the (device, revision) pair
    product: str
    generation: str         # "NPU2" (AIE2P, what llama-npu targets), "NPU1" (AIE2) or another family
    firmware_dirs: tuple[str, ...]   # directories under amdnpu/ the driver loads from


# (PCI device id, PCI revision) -> model. Ids and revisions: the `amdxdna_ids` table of the amdxdna
# driver (Linux drivers/accel/amdxdna/amdxdna_pci_drv.c, amd/xdna-driver src/driver/amdxdna/
# amdxdna_pci_drv.c); products: mlir-aie utils/env_setup.sh ("npu4 => Strix, npu5 => Strix Halo,
# npu6 => Krackan"); firmware directories: the fw_path of npu1/4/5/6_regs.c (npu6 loads 17f0_10's).
NPU_MODELS = {
    (0x1502, 0x00): NpuModel("npu1", "Phoenix / Hawk Point", "NPU1", ("1502_00",)),
    (0x17F0, 0x00): NpuModel("npu2", "Strix prototype", "pre-production NPU2", ("17f0_00",)),
    (0x17F0, 0x10): NpuModel("npu4", "Strix", "NPU2", ("17f0_10",)),
    (0x17F0, 0x11): NpuModel("npu5", "Strix Halo", "NPU2", ("17f0_11",)),
    (0x17F0, 0x20): NpuModel("npu6", "Krackan", "NPU2", ("17f0_20", "17f0_10")),
}
# Newer devices of the out-of-tree amd/xdna-driver ("npu3" family, a different code path).
OTHER_XDNA_DEVICES = {0x17F1, 0x17F3, 0x1B0A, 0x1B0C}
NPU_DEVICE_IDS = {d for d, _ in NPU_MODELS} | OTHER_XDNA_DEVICES
# Names the driver requests (npu.sbin: mainline; npu_7.sbin: mainline with protocol 7 firmware;
# npu.dev.sbin: amd/xdna-driver); the kernel's firmware loader also tries .zst / .xz.
FIRMWARE_NAMES = ("npu.sbin", "npu_7.sbin", "npu.dev.sbin")
FIRMWARE_SUFFIXES = ("", ".zst", ".xz")
FIRMWARE_ROOTS = ("/lib/firmware/updates", "/lib/firmware", "/usr/lib/firmware/updates", "/usr/lib/firmware")


@dataclass(frozen=True)
class PciNpu:
    bdf: str
    device: int
    revision: int
    model: NpuModel | None
    driver: str | None       # driver bound to the PCI function (basename of .../driver)
    vbnv: str | None         # the name amdxdna publishes in sysfs once bound
    fw_version: str | None   # firmware version amdxdna publishes in sysfs once bound

    @property
    def ids(self) -> str:
        return f"{AMD_VENDOR:04x}:{self.device:04x} rev {self.revision:02x}"

    @property
    def is_npu2(self) -> bool:
        return self.model is not None and self.model.generation == "NPU2"

    def describe(self) -> str:
        name = (f"{self.model.xdna_name} {self.model.product}" if self.model else "unknown revision")
        return f"{self.bdf} {self.ids} = {name}"


@dataclass
class Facts:
    """What earlier probes found, for the ones that depend on it."""
    release: str | None = None
    kernel: tuple[int, int] | None = None
    driver: str = "absent"          # module | built-in | loaded | available | absent
    driver_source: str = ""         # in-tree | out-of-tree (DKMS) | ""
    driver_version: str | None = None
    npus: list[PciNpu] = field(default_factory=list)
    npu: PciNpu | None = None
    accel_node: str | None = None
    xrt_smi: str | None = None
    examine: object | None = None   # CmdResult of `xrt-smi examine`
    notes: dict = field(default_factory=dict)


def _hex(text: str | None) -> int | None:
    try:
        return int((text or "").strip(), 16)
    except ValueError:
        return None


def _link_name(path) -> str | None:
    try:
        return os.path.basename(os.readlink(path))
    except OSError:
        return None


def _cat(path) -> str | None:
    try:
        return Path(path).read_text(errors="replace")
    except OSError:
        return None


def _first_line(text: str | None) -> str | None:
    if text is None:
        return None
    t = text.strip().splitlines()
    return t[0].strip() if t and t[0].strip() else None


# ------------------------------------------------------------------------------------------ probes
def scan_pci(m: Machine) -> list[PciNpu]:
    out = []
    for d in m.glob("/sys/bus/pci/devices/*"):
        if _hex(_cat(d / "vendor")) != AMD_VENDOR:
            continue
        dev = _hex(_cat(d / "device"))
        if dev not in NPU_DEVICE_IDS:
            continue
        rev = _hex(_cat(d / "revision")) or 0
        out.append(PciNpu(d.name, dev, rev, NPU_MODELS.get((dev, rev)), _link_name(d / "driver"),
                          _first_line(_cat(d / "vbnv")), _first_line(_cat(d / "fw_version"))))
    return out


def check_kernel(m: Machine, f: Facts) -> Check:
    f.release = _first_line(m.read("/proc/sys/kernel/osrelease"))
    _probe_driver(m, f)
    if not f.release:
        return Check("kernel", "kernel", SKIP, "no /proc/sys/kernel/osrelease to read")
    mm = re.match(r"(\d+)\.(\d+)", f.release)
    f.kernel = (int(mm[1]), int(mm[2])) if mm else None
    if f.kernel is None:
        return Check("kernel", "kernel", SKIP, f"Linux {f.release} (version not understood)")
    data = {"release": f.release}
    if f.kernel >= MIN_INTREE_KERNEL:
        return Check("kernel", "kernel", OK, f"Linux {f.release} (amdxdna is in-tree from 6.14)", data=data)
    if f.driver != "absent":
        return Check("kernel", "kernel", OK, f"Linux {f.release} with an out-of-tree amdxdna", data=data)
    return Check("kernel", "kernel", FAIL, f"Linux {f.release} has no in-tree amdxdna (needs 6.14 or newer)",
                 fix="upgrade to Linux 6.14 or newer, or build and install the out-of-tree amdxdna driver "
                     "from amd/xdna-driver for this kernel",
                 anchor="amdxdna-driver", data=data)


def _probe_driver(m: Machine, f: Facts) -> None:
    modules = m.read("/proc/modules") or ""
    rel = f.release or ""
    builtin = (m.read(f"/lib/modules/{rel}/modules.builtin") or "") if rel else ""
    dep = (m.read(f"/lib/modules/{rel}/modules.dep") or "") if rel else ""
    dep_line = next((ln for ln in dep.splitlines() if re.search(r"/amdxdna\.ko(\.\w+)?:", ln)), "")
    if any(ln.split(" ", 1)[0] == "amdxdna" for ln in modules.splitlines()):
        f.driver = "module"
    elif re.search(r"/amdxdna\.ko\b", builtin):
        f.driver = "built-in"
    elif m.path("/sys/module/amdxdna").is_dir():
        f.driver = "loaded"
    elif dep_line:
        f.driver = "available"
    if dep_line:
        f.driver_source = "in-tree" if "kernel/drivers/accel/amdxdna/" in dep_line else "out-of-tree (DKMS)"
    elif f.driver == "built-in":
        f.driver_source = "in-tree"
    f.driver_version = _first_line(m.read("/sys/module/amdxdna/version"))


def check_driver(m: Machine, f: Facts) -> Check:
    rel = f.release or "this kernel"
    data = {"state": f.driver, "source": f.driver_source, "version": f.driver_version}
    if f.driver in ("module", "built-in", "loaded"):
        what = {"module": "loaded as a module", "built-in": "built into the kernel", "loaded": "loaded"}[f.driver]
        extra = ", ".join(x for x in (f.driver_source, f"version {f.driver_version}" if f.driver_version else "")
                          if x)
        detail = f"amdxdna {what}" + (f" ({extra})" if extra else "")
        unbound = [n for n in f.npus if n.driver != "amdxdna"]
        if unbound and not any(n.driver == "amdxdna" for n in f.npus):
            n = unbound[0]
            return Check("driver", "amdxdna driver", FAIL,
                         f"{detail}, but it did not bind the NPU at {n.bdf}"
                         + (f" (bound to {n.driver})" if n.driver else ""),
                         fix="read `sudo dmesg | grep -i amdxdna`: a missing firmware file or a firmware/driver "
                             "protocol mismatch makes the probe fail (see the firmware line)",
                         anchor="amdxdna-driver", data=data)
        return Check("driver", "amdxdna driver", OK, detail, data=data)
    if f.driver == "available":
        return Check("driver", "amdxdna driver", FAIL, f"amdxdna is installed for Linux {rel} but not loaded",
                     fix="load it with `sudo modprobe amdxdna`, then check `sudo dmesg | grep -i amdxdna`",
                     anchor="amdxdna-driver", data=data)
    return Check("driver", "amdxdna driver", FAIL, f"no amdxdna module for Linux {rel}",
                 fix="use a kernel built with CONFIG_DRM_ACCEL_AMDXDNA (6.14+) or install the out-of-tree "
                     "driver from amd/xdna-driver (DKMS), then `sudo modprobe amdxdna`",
                 anchor="amdxdna-driver", data=data)


def check_npu(m: Machine, f: Facts) -> Check:
    f.npus = f.npus or scan_pci(m)
    npu2 = [n for n in f.npus if n.is_npu2]
    f.npu = npu2[0] if npu2 else (f.npus[0] if f.npus else None)
    data = {"devices": [{"bdf": n.bdf, "device": f"{n.device:04x}", "revision": f"{n.revision:02x}",
                         "xdna_name": n.model.xdna_name if n.model else None,
                         "generation": n.model.generation if n.model else None, "driver": n.driver}
                        for n in f.npus]}
    if f.npu is None:
        return Check("npu", "NPU device", FAIL,
                     "no AMD NPU on the PCI bus (no 1022:1502 / 1022:17f0 function in /sys/bus/pci/devices)",
                     fix="this machine has no Ryzen AI NPU, or it is disabled in the firmware setup (enable "
                         "the IPU/NPU option in the BIOS); without one use DEVICE=emu",
                     anchor="supported-npus", data=data)
    n = f.npu
    if n.is_npu2:
        return Check("npu", "NPU device", OK, f"{n.describe()}: NPU2 (AIE2P), the generation llama-npu targets",
                     data=data)
    if n.model is not None and n.model.generation == "NPU1":
        return Check("npu", "NPU device", FAIL,
                     f"{n.describe()}: this is an NPU1 (AIE2); llama-npu targets NPU2 (AIE2P: Strix, "
                     f"Strix Halo, Krackan)",
                     fix="no setup step changes this: kernels built for npu2 do not run on an NPU1, so use "
                         "DEVICE=emu on this machine or run on a Ryzen AI 300-series (NPU2) machine",
                     anchor="supported-npus", data=data)
    return Check("npu", "NPU device", FAIL,
                 f"{n.describe()}: not an NPU2 (AIE2P) device llama-npu supports",
                 fix="llama-npu builds for NPU2 (PCI 1022:17f0 revisions 10, 11, 20); use DEVICE=emu here",
                 anchor="supported-npus", data=data)


def check_firmware(m: Machine, f: Facts) -> Check:
    n = f.npu
    if n is None:
        return Check("firmware", "NPU firmware", SKIP, "no NPU, nothing to look for")
    dirs = n.model.firmware_dirs if n.model else (f"{n.device:04x}_{n.revision:02x}",)
    roots = list(FIRMWARE_ROOTS)
    if f.release:
        roots = [f"/lib/firmware/updates/{f.release}", *roots[:2], f"/lib/firmware/{f.release}", *roots[2:]]
    seen_dirs, other_files = [], []
    for root in roots:
        for sub in dirs:
            d = m.path(f"{root}/amdnpu/{sub}")
            if not d.is_dir():
                continue
            seen_dirs.append(m.shown(d))
            for name in FIRMWARE_NAMES:
                for suf in FIRMWARE_SUFFIXES:
                    p = d / (name + suf)
                    if p.exists():
                        loaded = f"; running firmware {n.fw_version}" if n.fw_version else ""
                        return Check("firmware", "NPU firmware", OK, f"{m.shown(p)}{loaded}",
                                     data={"file": m.shown(p), "fw_version": n.fw_version})
            other_files += sorted(p.name for p in d.iterdir())
    wanted = "|".join(FIRMWARE_NAMES)
    if seen_dirs:
        found = ", ".join(other_files[:4]) or "nothing"
        detail = f"{seen_dirs[0]} holds {found} but none of the names amdxdna requests ({wanted}[.zst|.xz])"
    else:
        detail = f"no amdnpu/{dirs[0]}/ under /lib/firmware for {n.describe()}"
    return Check("firmware", "NPU firmware", FAIL, detail,
                 fix=f"install the NPU firmware for this device: a current linux-firmware package "
                     f"(amdnpu/{dirs[0]}/npu.sbin) or the firmware the amd/xdna-driver build installs, then "
                     f"reload amdxdna",
                 anchor="amdxdna-driver", data={"dirs": seen_dirs, "files": other_files})


def check_iommu(m: Machine, f: Facts) -> Check:
    cmdline = (m.read("/proc/cmdline") or "").split()
    off = [a for a in cmdline if a in ("amd_iommu=off", "iommu=off")]
    units = [p.name for p in m.glob("/sys/class/iommu/*")]
    if off:
        return Check("iommu", "IOMMU", FAIL, f"disabled on the kernel command line ({' '.join(off)})",
                     fix=f"remove {' '.join(off)} from the kernel command line: amdxdna attaches every "
                         f"process to the NPU through the IOMMU (SVA)",
                     anchor="amdxdna-driver")
    if units:
        return Check("iommu", "IOMMU", OK, f"on ({', '.join(units[:3])})", data={"units": units})
    if f.npu is None:
        return Check("iommu", "IOMMU", SKIP, "no IOMMU registered; no NPU either")
    return Check("iommu", "IOMMU", FAIL, "no IOMMU registered (/sys/class/iommu is empty)",
                 fix="enable the IOMMU in the BIOS: amdxdna attaches every process to the NPU through the "
                     "IOMMU (SVA)",
                 anchor="amdxdna-driver")


def _can_rw(st: os.stat_result, uid: int, gids: frozenset) -> bool:
    mode = st.st_mode
    if uid == 0:
        return True
    if st.st_uid == uid:
        return bool(mode & stat.S_IRUSR) and bool(mode & stat.S_IWUSR)
    if st.st_gid in gids:
        return bool(mode & stat.S_IRGRP) and bool(mode & stat.S_IWGRP)
    return bool(mode & stat.S_IROTH) and bool(mode & stat.S_IWOTH)


def check_device_node(m: Machine, f: Facts) -> Check:
    nodes = m.glob("/dev/accel/accel*")
    bound = {p.name: _link_name(p / "device" / "driver") for p in m.glob("/sys/class/accel/accel*")}
    ours = [p for p in nodes if bound.get(p.name) == "amdxdna"] or [p for p in nodes if p.name not in bound]
    if not ours:
        sys_nodes = [name for name, drv in bound.items() if drv == "amdxdna"]
        container = m.path("/.dockerenv").exists() or m.path("/run/.containerenv").exists()
        if sys_nodes:
            node = f"/dev/accel/{sys_nodes[0]}"
            where = "this container" if container else "/dev"
            return Check("device-node", "device node", FAIL,
                         f"amdxdna registered {sys_nodes[0]} (sysfs) but {node} is missing in {where}",
                         fix=f"give the container the device (`docker run --device {node}` / podman "
                             f"`--device {node}`) or check that udev created {node}",
                         anchor="device-access")
        return Check("device-node", "device node", FAIL, "no /dev/accel/accel* node bound to amdxdna",
                     fix="the node appears once amdxdna binds the NPU: fix the driver / firmware lines above "
                         "first",
                     anchor="amdxdna-driver")
    p = ours[0]
    f.accel_node = m.shown(p)
    try:
        st = p.stat()
    except OSError as e:
        return Check("device-node", "device node", FAIL, f"{f.accel_node}: {e.strerror}",
                     fix="check the node with `ls -l /dev/accel/`", anchor="device-access")
    owner, group = m.user_name(st.st_uid), m.group_name(st.st_gid)
    perms = stat.filemode(st.st_mode)
    ok = _can_rw(st, m.uid, m.gids) or (m.use_os_access and os.access(p, os.R_OK | os.W_OK))
    data = {"node": f.accel_node, "mode": perms, "owner": owner, "group": group, "user": m.user}
    desc = f"{f.accel_node} ({perms} {owner}:{group})"
    if ok:
        return Check("device-node", "device node", OK, f"{desc} readable and writable by {m.user}", data=data)
    if not (st.st_mode & stat.S_IRGRP and st.st_mode & stat.S_IWGRP):
        fix = (f"give a group read/write access with a udev rule (SUBSYSTEM==\"accel\", KERNEL==\"accel*\", "
               f"GROUP=\"render\", MODE=\"0660\"), then add {m.user} to that group")
    elif m.listed_in_group(st.st_gid):
        fix = (f"{m.user} is listed in group {group} in /etc/group but this session predates it: log out and "
               f"back in (or run `newgrp {group}`)")
    else:
        fix = f"add {m.user} to group {group}: `sudo usermod -aG {group} {m.user}`, then log out and back in"
    return Check("device-node", "device node", FAIL, f"{desc} is not readable and writable by {m.user} "
                 f"(not in group {group})", fix=fix, anchor="device-access", data=data)
