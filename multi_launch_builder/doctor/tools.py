"""aircc (mlir-air), aiecc (mlir-aie) and Peano (llvm-aie): found, runnable, versions, and whether they
are a known-compatible set. The mlir_air wheel's `[aie]` extra pins the exact mlir_aie version the
AIR wheel was built and tested against (mlir-air utils/mlir_air_wheels/setup.py, get_extras_require:
`mlir_aie==<version>`, llvm-aie unpinned); the installed mlir_aie must be that version.
"""
from __future__ import annotations

import re
from pathlib import Path

from kernel_builder.toolchain import toolchain_versions, version_line
from .machine import Machine
from multi_launch_builder.doctor.check_report import FAIL, OK, SKIP, Check
from .system import Facts

INDEX_HINT = ("`pip install 'mlir_air[aie]'` with pip's -f pointing at the mlir-air, mlir-aie and llvm-aie "
              "GitHub release wheel indexes")
_PIN = re.compile(r"^\s*(mlir[_-]aie(?:[_-]no[_-]rtti)?)\s*\(?\s*==\s*([^\s;,)]+)", re.I)


def first_line(m: Machine):
    """`cmd -> version string` through the machine's runner, formatted as the cache key records it."""
    def run(cmd: list[str]) -> str:
        r = m.run(cmd)
        return version_line(r.stdout, r.stderr, r.returncode, r.failure)
    return run


def dist_version(m: Machine):
    def get(*names: str) -> str | None:
        d = m.dist_first(*names)
        return d.version if d else None
    return get


def detected_versions(m: Machine) -> dict[str, str] | None:
    """The npu toolchain's version strings as `llama-npu compile` would record them (None when a
    piece is missing)."""
    tc = m.tools()
    if not (tc.aircc and tc.aiecc and tc.peano):
        return None
    return toolchain_versions("npu", tc, first_line=first_line(m), dist_version=dist_version(m))


def _tool_check(m: Machine, cid: str, title: str, path: str | None, dists: tuple[str, ...], anchor: str,
                install: str) -> Check:
    if not path:
        return Check(cid, title, FAIL, "not found (PATH, then the wheel's bin/)", fix=install, anchor=anchor)
    res = m.run([path, "--version"])
    wheel = m.dist_first(*dists)
    wheel_txt = f"{wheel.name} {wheel.version}" if wheel else "not from a wheel"
    data = {"path": path, "wheel": wheel.version if wheel else None}
    if res.timed_out or res.failure:
        return Check(cid, title, FAIL, f"{path} --version {res.why()}",
                     fix=f"the installed {title} does not run; reinstall it ({install})", anchor=anchor, data=data)
    version = version_line(res.stdout, res.stderr, res.returncode)
    data["version"] = version
    return Check(cid, title, OK, f"{path} ({version}; {wheel_txt})", data=data)


def check_aircc(m: Machine, f: Facts) -> Check:
    return _tool_check(m, "aircc", "aircc", m.tools().aircc, ("mlir_air", "mlir-air"), "mlir-air",
                       f"install mlir-air: {INDEX_HINT}")


def check_aiecc(m: Machine, f: Facts) -> Check:
    return _tool_check(m, "aiecc", "aiecc", m.tools().aiecc, ("mlir_aie", "mlir-aie", "mlir_aie_no_rtti"),
                       "mlir-aie", f"install mlir-aie through mlir-air's extra: {INDEX_HINT}")


def check_peano(m: Machine, f: Facts) -> Check:
    tc = m.tools()
    install = ("install the llvm-aie wheel (pulled in by mlir_air[aie]) or set PEANO_INSTALL_DIR to a Peano "
               "install holding bin/clang++")
    if not tc.peano:
        return Check("peano", "Peano", FAIL, "not found ($PEANO_INSTALL_DIR, then the llvm-aie wheel)",
                     fix=install, anchor="peano")
    clang = Path(tc.peano) / "bin" / "clang"
    res = m.run([str(clang), "--version"])
    data = {"path": tc.peano}
    if res.timed_out or res.failure or res.returncode != 0:
        return Check("peano", "Peano", FAIL, f"{clang} --version {res.why()}",
                     fix=f"the Peano install at {tc.peano} does not run; {install}", anchor="peano", data=data)
    version = version_line(res.stdout, res.stderr, res.returncode)
    data["version"] = version
    targets = m.run([str(clang), "--print-targets"])
    # llvm-aie registers the NPU2 core as target "aie2p" (lib/Target/AIE/TargetInfo/AIETargetInfo.cpp)
    if targets.ok and not re.search(r"^\s*aie2p\s", targets.stdout, re.M):
        return Check("peano", "Peano", FAIL, f"{tc.peano} ({version}) has no aie2p target (NPU2 cores)",
                     fix="install a current llvm-aie wheel (older Peano builds only know aie/aie2)",
                     anchor="peano", data=data)
    extra = "aie2p target" if targets.ok else "targets not listed"
    return Check("peano", "Peano", OK, f"{tc.peano} ({version}; {extra})", data=data)


def check_toolchain_set(m: Machine, f: Facts) -> Check:
    tc = m.tools()
    if not (tc.aircc and tc.aiecc):
        return Check("toolchain-set", "toolchain set", SKIP, "aircc and aiecc are not both installed")
    air = m.dist_first("mlir_air", "mlir-air")
    aie = m.dist_first("mlir_aie", "mlir-aie", "mlir_aie_no_rtti")
    if air is None or aie is None:
        which = "mlir_air" if air is None else "mlir_aie"
        return Check("toolchain-set", "toolchain set", SKIP,
                     f"{which} is not a wheel (source build): no pin to compare against")
    pins = [mm for mm in (_PIN.match(r) for r in air.requires) if mm]
    data = {"mlir_air": air.version, "mlir_aie": aie.version, "pinned_mlir_aie": pins[0][2] if pins else None}
    if not pins:
        return Check("toolchain-set", "toolchain set", SKIP,
                     f"mlir_air {air.version} declares no mlir_aie pin (installed mlir_aie {aie.version})", data=data)
    pinned = pins[0][2]
    if pinned != aie.version:
        return Check("toolchain-set", "toolchain set", FAIL,
                     f"mlir_air {air.version} was built and tested against mlir_aie {pinned}, but mlir_aie "
                     f"{aie.version} is installed",
                     fix=f"install the pinned pair: `pip install 'mlir_aie=={pinned}'` (or reinstall "
                         f"'mlir_air[aie]'), then `make compile DEVICE=npu`",
                     anchor="mlir-air", data=data)
    return Check("toolchain-set", "toolchain set", OK,
                 f"mlir_air {air.version} pins mlir_aie=={pinned}, which is installed", data=data)
