"""`llama-npu doctor` on fake machines, the NPU itself: a healthy NPU2 setup passes (exit 0); each broken piece of
driver, firmware, IOMMU, device node and memlock gives its ✗ line with the fix sentence and a docs/npu-setup.md
section (the XRT / toolchain / cache / runner checks: test_doctor_software.py)."""
from __future__ import annotations

from doctor_checks import ANCHORS, checks_of, only_failure
from doctor_fakes import AIE_WHEEL, BDF, GIB, USER, examine, healthy, remove, write
from multi_launch_builder.doctor import CHECK_IDS, FAIL, OK, SKIP, MemoryNeed, exit_code, render_text



def test_healthy_machine_passes_every_check(tmp_path):
    fm = healthy(tmp_path)
    by_id, checks = checks_of(fm, cache_dir=tmp_path / "kernels")
    assert [c.id for c in checks] == list(CHECK_IDS)
    assert exit_code(checks) == 0, render_text(checks)
    assert {c.id for c in checks if c.status == SKIP} == {"kernel-cache"}  # nothing compiled yet
    assert "NPU2 (AIE2P)" in by_id["npu"].detail and "npu4 Strix" in by_id["npu"].detail
    assert by_id["firmware"].detail.startswith("/lib/firmware/amdnpu/17f0_10/npu.sbin.zst")
    assert "readable and writable by alice" in by_id["device-node"].detail
    assert by_id["xrt"].detail.startswith("XRT 2.19.0")
    assert "pyxrt.cpython-312" in by_id["pyxrt"].detail
    assert f"pins mlir_aie=={AIE_WHEEL}" in by_id["toolchain-set"].detail
    assert render_text(checks).splitlines()[-1] == "NPU path: ready"


def test_driver_missing_on_an_old_kernel(tmp_path):
    fm = healthy(tmp_path)
    write(fm.root, "/proc/sys/kernel/osrelease", "6.8.0-45-generic\n")
    fm.unload_driver(release="6.8.0-45-generic")
    by_id, checks = checks_of(fm)
    assert by_id["kernel"].status == FAIL and "upgrade to Linux 6.14" in by_id["kernel"].fix
    assert by_id["driver"].status == FAIL and "no amdxdna module for Linux 6.8.0-45-generic" in by_id["driver"].detail
    assert "CONFIG_DRM_ACCEL_AMDXDNA" in by_id["driver"].fix and "amd/xdna-driver" in by_id["driver"].fix
    assert by_id["device-node"].status == FAIL and exit_code(checks) == 1


def test_driver_installed_but_not_loaded(tmp_path):
    fm = healthy(tmp_path)
    fm.unload_driver(installed=True)
    c = only_failure(fm, "driver", also={"device-node"})
    assert "installed for Linux" in c.detail and "`sudo modprobe amdxdna`" in c.fix


def test_driver_loaded_but_not_bound(tmp_path):
    fm = healthy(tmp_path)
    fm.set_pci(bound=False)
    c = only_failure(fm, "driver", also={"device-node"})
    assert f"did not bind the NPU at {BDF}" in c.detail and "dmesg" in c.fix


def test_npu1_machine_is_told_we_target_npu2(tmp_path):
    fm = healthy(tmp_path)
    fm.set_pci(device=0x1502, revision=0x00)
    write(fm.root, "/lib/firmware/amdnpu/1502_00/npu.sbin", "fw")
    fm.commands["xrt-smi examine"] = examine(devices=((BDF, "NPU Phoenix"),))
    by_id, checks = checks_of(fm)
    c = by_id["npu"]
    assert c.status == FAIL and "NPU1 (AIE2)" in c.detail and "targets NPU2" in c.detail
    assert "DEVICE=emu" in c.fix and c.anchor in ANCHORS
    assert by_id["firmware"].status == OK and "1502_00" in by_id["firmware"].detail
    assert by_id["xrt-smi"].status == FAIL and "NPU Phoenix" in by_id["xrt-smi"].detail
    assert exit_code(checks) == 1


def test_no_npu_on_the_bus(tmp_path):
    fm = healthy(tmp_path)
    remove(fm.root, "/sys/bus/pci/devices")
    by_id, _ = checks_of(fm)
    assert by_id["npu"].status == FAIL and "BIOS" in by_id["npu"].fix
    assert by_id["firmware"].status == SKIP


def test_firmware_missing(tmp_path):
    fm = healthy(tmp_path)
    remove(fm.root, "/lib/firmware/amdnpu")
    c = only_failure(fm, "firmware")
    assert "no amdnpu/17f0_10/" in c.detail and "amdnpu/17f0_10/npu.sbin" in c.fix


def test_firmware_present_only_under_a_versioned_name(tmp_path):
    fm = healthy(tmp_path)
    remove(fm.root, "/lib/firmware/amdnpu/17f0_10/npu.sbin.zst")
    write(fm.root, "/lib/firmware/amdnpu/17f0_10/npu.sbin.1.0.0.63.zst", "fw")
    c = only_failure(fm, "firmware")
    assert "npu.sbin.1.0.0.63.zst" in c.detail and "none of the names amdxdna requests" in c.detail


def test_krackan_loads_the_strix_firmware_directory(tmp_path):
    fm = healthy(tmp_path)
    fm.set_pci(revision=0x20)
    by_id, checks = checks_of(fm)
    assert "npu6 Krackan" in by_id["npu"].detail and by_id["firmware"].status == OK
    assert exit_code(checks) == 0


def test_iommu_disabled_on_the_command_line(tmp_path):
    fm = healthy(tmp_path)
    write(fm.root, "/proc/cmdline", "root=UUID=1 ro amd_iommu=off\n")
    c = only_failure(fm, "iommu")
    assert "amd_iommu=off" in c.fix and "SVA" in c.fix


def test_device_node_not_accessible_names_the_group(tmp_path):
    fm = healthy(tmp_path)
    fm.gids = {12345}
    c = only_failure(fm, "device-node")
    assert "not in group render" in c.detail and "crw" not in c.detail  # a plain file stands in for the node
    assert c.fix.startswith(f"add {USER} to group render: `sudo usermod -aG render {USER}`")


def test_device_node_group_granted_but_session_predates_it(tmp_path):
    fm = healthy(tmp_path)
    fm.gids = {12345}
    text = (fm.root / "etc/group").read_text()
    lines = [ln + USER if ln.startswith("render:") else ln for ln in text.splitlines()]
    write(fm.root, "/etc/group", "\n".join(lines) + "\n")
    c = only_failure(fm, "device-node")
    assert "log out and back in" in c.fix and "newgrp render" in c.fix


def test_device_node_missing_in_a_container(tmp_path):
    fm = healthy(tmp_path)
    fm.set_accel(present=False)
    write(fm.root, "/.dockerenv")
    c = only_failure(fm, "device-node")
    assert "missing in this container" in c.detail and "--device /dev/accel/accel0" in c.fix


def test_memlock_too_low_gives_the_limits_conf_line(tmp_path):
    fm = healthy(tmp_path)
    fm.set_memlock("8388608", "8388608")
    c = only_failure(fm, "memlock")
    assert "8.0 MiB < 600.0 MiB" in c.detail
    assert f"`{USER}  -  memlock  1048576`" in c.fix and "/etc/security/limits.conf" in c.fix
    assert "ulimit -l 1048576" not in c.fix  # the hard limit is too low as well


def test_memlock_soft_limit_only(tmp_path):
    fm = healthy(tmp_path)
    fm.set_memlock("65536", "unlimited")
    c = only_failure(fm, "memlock", need=MemoryNeed("big", 5 * GIB + 1))
    assert c.fix.startswith("`ulimit -l 6291456` raises it for this shell")
    assert f"`{USER}  -  memlock  6291456`" in c.fix


def test_memlock_does_not_bind_a_process_with_cap_ipc_lock(tmp_path):
    fm = healthy(tmp_path)
    fm.set_memlock("8388608", "8388608")
    write(fm.root, "/proc/self/status", "Name:\tpython\nCapEff:\t000001ffffffffff\n")
    by_id, checks = checks_of(fm)
    assert by_id["memlock"].status == OK and "CAP_IPC_LOCK" in by_id["memlock"].detail
