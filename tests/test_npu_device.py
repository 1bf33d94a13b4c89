"""NpuDevice against a stand-in pyxrt (hardware glue: the one place a test double is right).

The stand-in records every call so the test can assert the XRT call sequence of both load flows.
"""
from __future__ import annotations

import sys
import types

import numpy as np
import pytest

from multi_launch_builder.executor import ModuleExecutor
from multi_launch_builder.devices.base import Artifact, DeviceRunError
from kernel_builder.numerics import to_bf16
from tests.small_decls import D, R, add_norm

COMPLETED, TIMEOUT = "ERT_CMD_STATE_COMPLETED", "ERT_CMD_STATE_TIMEOUT"


def make_pyxrt(log: list, final_state: str = COMPLETED):
    xrt = types.ModuleType("pyxrt")
    xrt.ert_cmd_state = types.SimpleNamespace(ERT_CMD_STATE_COMPLETED=COMPLETED, ERT_CMD_STATE_TIMEOUT=TIMEOUT)
    xrt.xclBOSyncDirection = types.SimpleNamespace(XCL_BO_SYNC_BO_TO_DEVICE="to_device",
                                                   XCL_BO_SYNC_BO_FROM_DEVICE="from_device")
    bos = []

    class _Bo:
        def __init__(self, size, tag):
            self.id = len(bos)
            self.mem = bytearray(size)
            bos.append(self)
            log.append((tag, size))

        def map(self):
            return memoryview(self.mem)

        def sync(self, direction):
            log.append(("sync", self.id, direction))

    _fake_hw_context_api(xrt, log, bos, _Bo, final_state)
    _fake_xclbin_api(xrt, log, _Bo, final_state)
    return xrt


def _fake_hw_context_api(xrt, log: list, bos: list, _Bo, final_state: str) -> None:
    """pyxrt's device / elf / hw_context / ext.kernel / ext.bo / run (the ELF path), logging every call."""

    class device:
        def __init__(self, index):
            log.append(("device", index))

        def register_xclbin(self, xclbin):
            log.append(("register_xclbin",))

    class elf:
        def __init__(self, path):
            log.append(("elf", path))

    class hw_context:
        def __init__(self, dev, what):
            assert isinstance(dev, device)
            log.append(("hw_context", type(what).__name__))

    class _ExtKernel:
        def __init__(self, ctx, name):
            assert isinstance(ctx, hw_context)
            log.append(("ext.kernel", name))

    class _ExtBo(_Bo):
        def __init__(self, dev, size):
            super().__init__(size, "ext.bo")

    xrt.ext = types.SimpleNamespace(kernel=_ExtKernel, bo=_ExtBo)

    class run:
        def __init__(self, kernel):
            log.append(("run", type(kernel).__name__))

        def set_arg(self, i, bo):
            log.append(("set_arg", i, bo.id))

        def start(self):
            log.append(("start",))
            # the "kernel": y = x (arg 0) copied into the last bo, to check data really moves
            bos[-1].mem[:] = bos[-5].mem[: len(bos[-1].mem)]

        def wait2(self):
            log.append(("wait2",))
            return final_state

    xrt.device, xrt.elf, xrt.hw_context, xrt.run = device, elf, hw_context, run


def _fake_xclbin_api(xrt, log: list, _Bo, final_state: str) -> None:
    """pyxrt's xclbin / kernel / bo (the xclbin path), logging every call."""

    class _K:
        def __init__(self, name):
            self._n = name

        def get_name(self):
            return self._n

    class xclbin:
        def __init__(self, path):
            log.append(("xclbin", path))

        def get_uuid(self):
            return "uuid"

        def get_kernels(self):
            return [_K("MLIR_AIE")]

    class kernel:
        def __init__(self, ctx, name):
            log.append(("kernel", name))

        def group_id(self, i):
            return i

        def __call__(self, opcode, instr_bo, n_instr, *bos_):
            log.append(("call", opcode, n_instr, [b.id for b in bos_]))
            return types.SimpleNamespace(wait=lambda: final_state)

    class bo(_Bo):
        cacheable, host_only = "cacheable", "host_only"

        def __init__(self, dev, size, flags, group):
            super().__init__(size, f"bo[{flags},g{group}]")

    xrt.xclbin, xrt.kernel, xrt.bo = xclbin, kernel, bo


@pytest.fixture
def pyxrt_log(monkeypatch):
    log: list = []
    monkeypatch.setitem(sys.modules, "pyxrt", make_pyxrt(log))
    return log


def _elf_artifact(tmp_path, name="add_norm"):
    (tmp_path / f"{name}.mlir").write_text("module {}\n")
    (tmp_path / f"{name}.elf").write_bytes(b"\x7fELF")
    return Artifact(name, tmp_path / f"{name}.mlir", binary=tmp_path / f"{name}.elf", kernel=f"main:{name}")


def test_elf_flow_call_sequence(tmp_path, pyxrt_log):
    from multi_launch_builder.devices.npu import NpuDevice
    decl = add_norm()
    kc = ModuleExecutor(NpuDevice(), {"add_norm": _elf_artifact(tmp_path)}, [decl])
    rng = np.random.default_rng(0)
    x, r, w = (to_bf16(rng.standard_normal(s)) for s in ((R, D), (R, D), (D,)))
    out = kc.load_and_run("add_norm", x, r, w)
    log = pyxrt_log
    assert log[0] == ("device", 0)
    assert log[1] == ("elf", str(tmp_path / "add_norm.elf"))
    assert log[2] == ("hw_context", "elf")
    assert log[3] == ("ext.kernel", "main:add_norm")
    allocs = [e for e in log if e[0] == "ext.bo"]
    assert allocs == [("ext.bo", a.nbytes) for a in decl.args]          # one bo per argument, exact size
    first_run = log.index(("run", "_ExtKernel"))
    writes = [e[1] for e in log[:first_run] if e[0] == "sync" and e[2] == "to_device"]
    # zero-fill sync per allocation, then one write sync per input/static (x, r, w = bos 0, 1, 2)
    assert writes == [0, 1, 2, 3, 4, 0, 1, 2]
    assert log[first_run + 1: first_run + 8] == [("set_arg", i, i) for i in range(5)] + [("start",), ("wait2",)]
    assert log[first_run + 8:] == [("sync", 4, "from_device")]          # only the output is read back
    np.testing.assert_array_equal(out["y"].view(np.uint16), x.view(np.uint16))  # bytes travelled
    # second call: inputs only, the run object (args bound) is reused
    n = len(log)
    kc.load_and_run("add_norm", x, r)
    assert log[n:] == [("sync", 0, "to_device"), ("sync", 1, "to_device"), ("start",), ("wait2",),
                       ("sync", 4, "from_device")]


def test_failed_run_state_raises_naming_the_module(tmp_path, monkeypatch):
    from multi_launch_builder.devices.npu import NpuDevice
    monkeypatch.setitem(sys.modules, "pyxrt", make_pyxrt([], final_state=TIMEOUT))
    kc = ModuleExecutor(NpuDevice(), {"add_norm": _elf_artifact(tmp_path)}, [add_norm()])
    z = np.zeros((R, D), dtype=to_bf16(0).dtype)
    with pytest.raises(DeviceRunError, match="add_norm.*ERT_CMD_STATE_TIMEOUT"):
        kc.load_and_run("add_norm", z, z, np.zeros(D, z.dtype))


def test_xclbin_flow_uses_instruction_bo_and_group_ids(tmp_path, pyxrt_log):
    from multi_launch_builder.devices.npu import NpuDevice
    (tmp_path / "m.xclbin").write_bytes(b"x")
    np.arange(6, dtype=np.uint32).tofile(tmp_path / "m.insts.bin")
    (tmp_path / "m.mlir").write_text("module {}\n")
    art = Artifact("add_norm", tmp_path / "m.mlir", xclbin=tmp_path / "m.xclbin",
                   insts=tmp_path / "m.insts.bin", kernel="MLIR_AIE")
    kc = ModuleExecutor(NpuDevice(), {"add_norm": art}, [add_norm()])
    z = np.zeros((R, D), dtype=to_bf16(0).dtype)
    kc.load_and_run("add_norm", z, z, np.zeros(D, z.dtype))
    log = pyxrt_log
    assert ("register_xclbin",) in log and ("hw_context", "str") in log and ("kernel", "MLIR_AIE") in log
    assert ("bo[cacheable,g1]", 24) in log                               # 6 instruction words
    assert [e for e in log if e[0].startswith("bo[host_only")] == [
        (f"bo[host_only,g{i + 3}]", a.nbytes) for i, a in enumerate(add_norm().args)]
    call = [e for e in log if e[0] == "call"][0]
    assert call[1:3] == (3, 6) and len(call[3]) == 5                     # opcode 3, n_instr, 5 data bos


def test_npu_module_imports_without_pyxrt(monkeypatch):
    monkeypatch.setitem(sys.modules, "pyxrt", None)
    import importlib

    import multi_launch_builder.devices.npu as npu
    importlib.reload(npu)
    dev = npu.NpuDevice()
    with pytest.raises(RuntimeError, match="pyxrt"):
        dev.alloc(16)


def test_elf_run_is_rebound_after_the_buffer_set_is_freed(tmp_path, pyxrt_log):
    """A freed-and-reallocated buffer set must never reuse a run bound to the old bos (ids can repeat)."""
    from multi_launch_builder.devices.npu import NpuDevice
    kc = ModuleExecutor(NpuDevice(), {"add_norm": _elf_artifact(tmp_path)}, [add_norm()])
    rng = np.random.default_rng(1)
    x, r, w = (to_bf16(rng.standard_normal(s)) for s in ((R, D), (R, D), (D,)))
    kc.load_and_run("add_norm", x, r, w)
    for _ in range(3):
        kc.free("add_norm")
        n = len(pyxrt_log)
        out = kc.load_and_run("add_norm", x, r, w)
        new_bos = [e for e in pyxrt_log[n:] if e[0] == "ext.bo"]
        bound = [e[2] for e in pyxrt_log[n:] if e[0] == "set_arg"]
        assert len(new_bos) == 5 and len(bound) == 5                    # a fresh run over the new bos
        np.testing.assert_array_equal(out["y"].view(np.uint16), x.view(np.uint16))


def test_xclbin_flow_single_kernel_accepts_the_default_name(tmp_path, pyxrt_log):
    from multi_launch_builder.devices.npu import NpuDevice
    (tmp_path / "m.xclbin").write_bytes(b"x")
    np.arange(4, dtype=np.uint32).tofile(tmp_path / "m.insts.bin")
    (tmp_path / "m.mlir").write_text("module {}\n")
    art = Artifact("add_norm", tmp_path / "m.mlir", xclbin=tmp_path / "m.xclbin", insts=tmp_path / "m.insts.bin")
    NpuDevice().load(art)
    assert ("kernel", "MLIR_AIE") in pyxrt_log
    bad = Artifact("add_norm", tmp_path / "m.mlir", xclbin=tmp_path / "m.xclbin", insts=tmp_path / "m.insts.bin",
                   kernel="other")
    with pytest.raises(DeviceRunError, match="add_norm: kernel 'other' not in xclbin"):
        NpuDevice().load(bad)


def test_elf_ref_binds_the_producers_bo_and_keeps_both_runs(tmp_path, pyxrt_log):
    """A ref rebinds one slot to another module's bo: no host sync for it, a run bound to that bo
    (cached under its own buffer list), and the unaliased run is still reused afterwards."""
    from multi_launch_builder.devices.npu import NpuDevice
    a, b = add_norm("prod"), add_norm("cons")
    kc = ModuleExecutor(NpuDevice(), {"prod": _elf_artifact(tmp_path, "prod"), "cons": _elf_artifact(tmp_path, "cons")},
                     [a, b])
    rng = np.random.default_rng(2)
    x, r, w = (to_bf16(rng.standard_normal(s)) for s in ((R, D), (R, D), (D,)))
    kc.load_and_run("prod", x, r, w, read=())
    kc.load_and_run("cons", x, r, w)
    prod_y = 4                                                             # prod's bos are 0..4 (y last)
    n = len(pyxrt_log)
    kc.load_and_run("cons", kc.ref("prod", "y"), r)
    log = pyxrt_log[n:]
    assert ("sync", 5, "to_device") not in log                             # cons.x is not written
    assert ("sync", 6, "to_device") in log                                 # cons.r is
    assert ("run", "_ExtKernel") in log and ("set_arg", 0, prod_y) in log  # a run bound to prod's y bo
    assert kc.counters["cons"].bytes_written == (2 * R * D * 2 + D * 2) + R * D * 2   # then r only
    n = len(pyxrt_log)
    kc.load_and_run("cons", x, r)                                          # back to its own x bo
    assert ("run", "_ExtKernel") not in pyxrt_log[n:] and ("sync", 5, "to_device") in pyxrt_log[n:]
    n = len(pyxrt_log)
    kc.load_and_run("cons", kc.ref("prod", "y"), r)                        # the aliased run is reused too
    assert ("run", "_ExtKernel") not in pyxrt_log[n:]


def test_xclbin_ref_carries_the_producers_device_bytes_when_rehoming(tmp_path, pyxrt_log):
    """xclbin flow: bos live in a kernel's group ids, so a ref'd bo is re-homed for the consumer; the
    producer's device-side result is synced back first so the bytes survive the move."""
    from multi_launch_builder.devices.npu import NpuDevice
    arts = {}
    for name in ("prod", "cons"):
        (tmp_path / f"{name}.xclbin").write_bytes(b"x")
        np.arange(4, dtype=np.uint32).tofile(tmp_path / f"{name}.insts.bin")
        (tmp_path / f"{name}.mlir").write_text("module {}\n")
        arts[name] = Artifact(name, tmp_path / f"{name}.mlir", xclbin=tmp_path / f"{name}.xclbin",
                              insts=tmp_path / f"{name}.insts.bin", kernel="MLIR_AIE")
    kc = ModuleExecutor(NpuDevice(), arts, [add_norm("prod"), add_norm("cons")])
    z = np.zeros((R, D), dtype=to_bf16(0).dtype)
    kc.load_and_run("prod", z, z, np.zeros(D, z.dtype), read=())
    y_bo = [e for e in pyxrt_log if e[0].startswith("bo[host_only")][-1]   # prod's y, group 7
    y_id = sum(1 for e in pyxrt_log if e[0] in ("ext.bo",) or e[0].startswith("bo[")) - 1
    kc.load_and_run("cons", kc.ref("prod", "y"), z, np.zeros(D, z.dtype))
    assert y_bo[0] == "bo[host_only,g7]"
    assert ("sync", y_id, "from_device") in pyxrt_log                    # fetched before re-homing
