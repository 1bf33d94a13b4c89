"""The npu build stage: Peano compiles the linked external kernels, then aircc (which drives aiecc) writes
<name>.elf; every command and its output go to the module's build log."""
from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

from kernel_builder.toolchain import Toolchain
from .keys import ExternalRef
from multi_launch_builder.compile.build_report import BuildError


def _run_logged(cmd: list[str], log: Path, cwd: Path, what: str, module: str) -> None:
    with open(log, "a") as f:
        f.write(f"$ {' '.join(cmd)}\n")
        f.flush()
        r = subprocess.run(cmd, cwd=cwd, stdout=f, stderr=subprocess.STDOUT)
    if r.returncode != 0:
        raise BuildError(f"module {module}: {what} failed (exit {r.returncode}); log: {log}")


def compile_externals(name: str, refs: list[ExternalRef], work: Path, tc: Toolchain, log: Path) -> None:
    """Peano compiles every linked external kernel into `work` (where aiecc looks for link_with objects)."""
    from external_kernels.compile_rules import aie_include_dir_from_env, compile_command
    include = Path(tc.aie_include) if tc.aie_include else aie_include_dir_from_env()
    if refs and include is None:
        raise BuildError(f"module {name}: the aie_api headers of mlir-aie were not found (set "
                         f"MLIR_AIE_INSTALL_DIR; see docs/npu-setup.md#mlir-aie)")
    for r in refs:
        if r.kernel is None:
            raise BuildError(f"module {name}: no external kernel rule produces {r.obj}; log: {log}")
        _run_logged(compile_command(r.kernel, work, Path(tc.peano), include), log, work,
                    f"Peano compile of {r.obj}", name)


def aircc_command(tc: Toolchain, src: Path, work: Path, output: list[str], preset_flags: list[str]) -> list[str]:
    """aircc for npu2 with Peano (no xchesscc / xbridge); `output` selects what it writes (--output-format ...)."""
    return [tc.aircc, str(src), "--device", "npu2", *output, "--tmpdir", str(work / "air_project"),
            "--peano", str(tc.peano), "--no-xchesscc", "--no-xbridge", *preset_flags]


def run_aircc(cmd: list[str], tc: Toolchain, work: Path, log: Path) -> int:
    """Run aircc (aiecc on its PATH) in `work`, appending the command and its output to `log`; its exit code."""
    env_path = os.pathsep.join([str(Path(tc.aiecc).parent), os.environ.get("PATH", "")])
    with open(log, "a") as f:
        f.write(f"$ {' '.join(cmd)}\n")
        f.flush()
        # cwd = work: aiecc resolves link_with objects and writes --get-* artifacts relative to it.
        r = subprocess.run(cmd, cwd=work, stdout=f, stderr=subprocess.STDOUT, env={**os.environ, "PATH": env_path})
    return r.returncode


def compile_npu(name: str, text: str, refs: list[ExternalRef], work: Path, out: Path, tc: Toolchain,
                 times: dict, log: Path, preset_flags: list[str]) -> dict[str, str]:
    """Peano for the externals, then aircc (which drives aiecc) -> <name>.elf. Returns files by role.
    Every command and its output go to `log` (outside the staging dir, so it survives a failure)."""
    t0 = time.perf_counter()
    compile_externals(name, refs, work, tc, log)
    times["externals"] = time.perf_counter() - t0

    src = work / "air.mlir"
    src.write_text(text)
    elf = out / f"{name}.elf"
    cmd = aircc_command(tc, src, work, ["--output-format", "elf", "--elf-name", str(elf)], preset_flags)
    t0 = time.perf_counter()
    rc = run_aircc(cmd, tc, work, log)
    times["aircc"] = time.perf_counter() - t0
    times["aiecc"] = None  # aiecc runs inside aircc; its time is part of the aircc column
    if rc != 0:
        raise BuildError(f"module {name}: aircc failed (exit {rc}); log: {log}")
    if not elf.is_file():
        raise BuildError(f"module {name}: aircc succeeded but wrote no {elf.name}; log: {log}")
    shutil.copy(log, out / "build.log")
    return {"binary": elf.name, "log": "build.log"}


def elf_kernel(name: str, text: str) -> str:
    """The kernel name an ELF artifact is run by: `main:<the module's public func>` (the one AIR reader's tree)."""
    from kernel_builder import air_module
    try:
        return f"main:{air_module.read(text).func.name}"
    except ValueError:
        return f"main:{name}"
