"""XRT: its version (>= 2.19), `pyxrt` importable from this interpreter, and `xrt-smi examine` listing
the NPU. `xrt-smi examine` prints an "XRT" block (Version, amdxdna, NPU Firmware Version) and a
"Device(s) Present" table of `|[BDF] |Name |` rows (see docs/npu-setup.md for the sources).
"""
from __future__ import annotations

import re
import sysconfig

from .machine import Machine
from multi_launch_builder.doctor.check_report import FAIL, OK, SKIP, Check
from .system import Facts

MIN_XRT = (2, 19)
XRT_PREFIX = "/opt/xilinx/xrt"
# Device names as xrt-smi prints them; the NPU2 set follows mlir-aie's utils/env_setup.sh.
NPU2_NAME = re.compile(r"NPU Strix|NPU Krackan|NPU Gorgon|RyzenAI-npu[456]", re.I)
NPU1_NAME = re.compile(r"NPU Phoenix|RyzenAI-npu1", re.I)
_ROW = re.compile(r"^\s*\|\s*\[([0-9A-Fa-f:.]+)\]\s*\|\s*([^|]+?)\s*\|", re.M)


def find_xrt_smi(m: Machine) -> str | None:
    found = m.which("xrt-smi")
    if found:
        return found
    cand = m.path(f"{XRT_PREFIX}/bin/xrt-smi")
    return str(cand) if cand.is_file() else None


def parse_examine(text: str) -> dict:
    """Version, amdxdna and firmware versions from the XRT block; the device rows."""
    out: dict = {"version": None, "amdxdna": None, "firmware": None, "devices": []}
    block = text.split("\nXRT", 1)[1] if "\nXRT" in text else text
    mm = re.search(r"^\s*Version\s*:\s*(\d+\.\d+(?:\.\d+)?)", block, re.M)
    if mm:
        out["version"] = mm[1]
    mm = re.search(r"^\s*amdxdna(?: Version)?\s*:\s*([^\n]+)", block, re.M | re.I)
    if mm:
        out["amdxdna"] = mm[1].strip()
    mm = re.search(r"^\s*NPU Firmware Version\s*:\s*([^\n]+)", block, re.M)
    if mm:
        out["firmware"] = mm[1].strip()
    out["devices"] = [(b, n.strip()) for b, n in _ROW.findall(text) if n.strip().lower() != "name"]
    return out


def _version_tuple(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in v.split("."))


def check_xrt(m: Machine, f: Facts) -> Check:
    f.xrt_smi = find_xrt_smi(m)
    if f.xrt_smi is None:
        return Check("xrt", "XRT", FAIL, f"xrt-smi not on PATH nor in {XRT_PREFIX}/bin",
                     fix=f"install XRT 2.19 or newer with its NPU plugin and `source {XRT_PREFIX}/setup.sh`",
                     anchor="xrt")
    res = m.run([f.xrt_smi, "examine"])
    f.examine = res
    if res.timed_out or res.failure:
        return Check("xrt", "XRT", FAIL, f"`xrt-smi examine` {res.why()}",
                     fix="a hung driver or device stops xrt-smi: check `sudo dmesg | grep -i amdxdna`, reload the "
                         "driver (`sudo modprobe -r amdxdna; sudo modprobe amdxdna`) or reboot",
                     anchor="xrt", data={"xrt_smi": f.xrt_smi})
    info = parse_examine(res.stdout + "\n" + res.stderr)
    data = {"xrt_smi": f.xrt_smi, **{k: v for k, v in info.items() if k != "devices"}}
    if info["version"] is None:
        return Check("xrt", "XRT", FAIL, f"`xrt-smi examine` printed no XRT version ({res.why()})",
                     fix=f"reinstall XRT 2.19 or newer and `source {XRT_PREFIX}/setup.sh`", anchor="xrt", data=data)
    extra = ", ".join(x for x in (f"amdxdna {info['amdxdna']}" if info["amdxdna"] else "",
                                  f"NPU firmware {info['firmware']}" if info["firmware"] else "") if x)
    detail = f"XRT {info['version']}" + (f" ({extra})" if extra else "")
    if _version_tuple(info["version"])[:2] < MIN_XRT:
        return Check("xrt", "XRT", FAIL, f"{detail} is older than 2.19",
                     fix="install XRT 2.19 or newer (with the matching NPU plugin / xdna-driver build)",
                     anchor="xrt", data=data)
    return Check("xrt", "XRT", OK, detail, data=data)


def _other_pyxrt(m: Machine) -> list[str]:
    """pyxrt builds under the XRT prefix that this interpreter cannot load (another Python version)."""
    suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
    return [m.shown(p) for p in m.glob(f"{XRT_PREFIX}/python/pyxrt*.so")
            if not p.name.endswith(suffix) and p.name != "pyxrt.so"]


def check_pyxrt(m: Machine, f: Facts) -> Check:
    res = m.run([m.python, "-c", "import pyxrt; print(pyxrt.__file__)"])
    if res.ok and res.stdout.strip():
        where = res.stdout.strip().splitlines()[-1]
        return Check("pyxrt", "pyxrt", OK, f"imports from {where} (python {m.python})",
                     data={"path": where, "python": m.python})
    data = {"python": m.python, "error": res.why()}
    if res.timed_out:
        return Check("pyxrt", "pyxrt", FAIL, f"`import pyxrt` {res.why()}",
                     fix="importing pyxrt hangs when XRT cannot reach the driver: fix the XRT / device lines, "
                         "then retry", anchor="xrt", data=data)
    err = res.stderr or res.stdout
    others = _other_pyxrt(m)
    if others:
        return Check("pyxrt", "pyxrt", FAIL,
                     f"not importable by {m.python}; {others[0]} is built for another Python version",
                     fix="create the virtual environment with the Python version XRT's pyxrt was built for, or "
                         "build XRT's Python bindings for this one", anchor="xrt", data=data)
    if "ModuleNotFoundError" in err or "No module named" in err:
        return Check("pyxrt", "pyxrt", FAIL, f"`import pyxrt` fails in {m.python}: no module named pyxrt",
                     fix=f"`source {XRT_PREFIX}/setup.sh` before running (it puts pyxrt on PYTHONPATH)",
                     anchor="xrt", data=data)
    return Check("pyxrt", "pyxrt", FAIL, f"`import pyxrt` fails in {m.python}: {res.why()}",
                 fix=f"`source {XRT_PREFIX}/setup.sh` (LD_LIBRARY_PATH for libxrt) and make sure XRT's NPU "
                     f"plugin matches the installed XRT", anchor="xrt", data=data)


def check_xrt_sees_npu(m: Machine, f: Facts) -> Check:
    res = f.examine
    if f.xrt_smi is None or res is None:
        return Check("xrt-smi", "xrt-smi device", SKIP, "no xrt-smi to ask (see the XRT line)")
    if res.timed_out or res.failure:
        return Check("xrt-smi", "xrt-smi device", SKIP, "xrt-smi did not answer (see the XRT line)")
    devices = parse_examine(res.stdout)["devices"]
    data = {"devices": [{"bdf": b, "name": n} for b, n in devices]}
    npu2 = [(b, n) for b, n in devices if NPU2_NAME.search(n)]
    if npu2:
        return Check("xrt-smi", "xrt-smi device", OK, f"lists {npu2[0][1]} at [{npu2[0][0]}]", data=data)
    npu1 = [(b, n) for b, n in devices if NPU1_NAME.search(n)]
    if npu1:
        return Check("xrt-smi", "xrt-smi device", FAIL, f"lists only {npu1[0][1]} at [{npu1[0][0]}] (an NPU1)",
                     fix="llama-npu needs an NPU2 (Strix, Strix Halo, Krackan); use DEVICE=emu on this machine",
                     anchor="supported-npus", data=data)
    shown = ", ".join(n for _, n in devices) or "no device"
    return Check("xrt-smi", "xrt-smi device", FAIL, f"`xrt-smi examine` lists {shown}",
                 fix="XRT does not see the NPU: install XRT's NPU plugin (xrt_plugin-amdxdna / xrt-npu) built "
                     "for this XRT and fix the driver / device-node lines above",
                 anchor="xrt", data=data)
