"""Real NPU through pyxrt (XRT's Python bindings). pyxrt is imported lazily.

Two load flows, chosen by the artifact:
- ELF (aircc --output-format elf; the default we build): xrt.elf(path) -> xrt.hw_context(device, elf)
  -> xrt.ext.kernel(ctx, "main:<func>"); buffers are xrt.ext.bo(device, nbytes); a run is
  xrt.run(kernel) + set_arg(i, bo) per argument + start() + wait2().
- xclbin + instruction stream: device.register_xclbin(xclbin) -> xrt.hw_context(device, uuid) ->
  xrt.kernel(ctx, name); the instructions live in a cacheable bo in group_id(1); a call is
  kernel(3, instr_bo, n_instr_words, *bos) (opcode 3 = transaction) and data bos are placed in
  group_id(i + 3), so they are created on first run (allocation has no kernel to ask).

Host<->device traffic goes through each bo's mapping + sync (the approach mlir-air's own backend
takes; bo.write/bo.read misbehave with numpy 2 on older pyxrt). Every run's ert_cmd_state is
checked: anything but COMPLETED raises DeviceRunError naming the module and the state.
"""
from __future__ import annotations


import numpy as np

from .base import Artifact, Buffer, Device, DeviceRunError, DeviceStats, check_nbytes, check_view


MAX_CACHED_RUNS = 64   # xrt.run objects kept per loaded module (one per distinct buffer list, oldest dropped)
# Hardware contexts held at once. amdxdna allows 16 per device on npu2, shared with every other process, and
# mlir-air saw timeouts and CREATE_HWCTX failures from ~10 ELFs per process (docs/hardware-model.md); the
# ModuleExecutor unloads the least recently used module beyond this. LLAMA_NPU_MAX_CONTEXTS overrides it.
DEFAULT_MAX_CONTEXTS = 8


def _xrt():
    try:
        import pyxrt
    except ImportError as e:  # pragma: no cover - exercised only without a stand-in
        raise RuntimeError("the npu device needs pyxrt (XRT >= 2.19); see docs/npu-setup.md#xrt") from e
    return pyxrt


class NpuBuffer(Buffer):
    __slots__ = ("nbytes", "bo", "host", "dirty", "group_owner")

    def __init__(self, nbytes: int, bo=None):
        self.nbytes = nbytes
        self.bo = bo              # None until bound (xclbin flow)
        self.host = None          # np.uint8 view of the bo mapping, or a staging array before binding
        self.dirty = False        # staged bytes not yet synced (xclbin flow, before binding)
        self.group_owner = None   # xclbin flow: the loaded kernel whose group ids this bo uses


class _Loaded:
    def __init__(self, name: str, flow: str):
        self.name = name
        self.flow = flow          # "elf" | "xclbin"
        self.kernel = None
        self.context = None
        self.elf = None
        self.xclbin = None
        self.instr_bo = None
        self.n_instr = 0
        # ELF: one xrt.run per buffer set, args bound once: key -> (run, bound bos, buffers)
        self.runs: dict[tuple[int, ...], tuple] = {}


def _to_device(xrt):
    return xrt.xclBOSyncDirection.XCL_BO_SYNC_BO_TO_DEVICE


def _from_device(xrt):
    return xrt.xclBOSyncDirection.XCL_BO_SYNC_BO_FROM_DEVICE


class NpuDevice(Device):
    name = "npu"

    def __init__(self, index: int = 0, max_loaded: int | None = None):
        import os

        self.index = index
        self._device = None
        self.stats = DeviceStats()
        env = os.environ.get("LLAMA_NPU_MAX_CONTEXTS")
        self.max_loaded = max_loaded or (int(env) if env and env.isdigit() and int(env) > 0 else DEFAULT_MAX_CONTEXTS)

    @property
    def xrt_device(self):
        if self._device is None:
            self._device = _xrt().device(self.index)
        return self._device

    # ---------------------------------------------------------------- load
    def load(self, artifact: Artifact) -> _Loaded:
        xrt = _xrt()
        dev = self.xrt_device
        if artifact.binary is not None and str(artifact.binary).endswith(".elf"):
            h = _Loaded(artifact.name, "elf")
            kname = artifact.kernel if ":" in artifact.kernel else f"main:{artifact.name}"
            try:
                h.elf = xrt.elf(str(artifact.binary))
                h.context = xrt.hw_context(dev, h.elf)
                h.kernel = xrt.ext.kernel(h.context, kname)
            except Exception as e:
                raise DeviceRunError(f"module {artifact.name}: cannot load ELF {artifact.binary} "
                                     f"(kernel {kname!r}): {e}") from e
        elif artifact.xclbin is not None and artifact.insts is not None:
            h = _Loaded(artifact.name, "xclbin")
            try:
                h.xclbin = xrt.xclbin(str(artifact.xclbin))
                dev.register_xclbin(h.xclbin)
                h.context = xrt.hw_context(dev, h.xclbin.get_uuid())
                names = [k.get_name() for k in h.xclbin.get_kernels()]
                match = [n for n in names if artifact.kernel in n]
                if not match and len(names) == 1 and artifact.kernel.startswith("main"):
                    match = names  # default/ELF-style name on a single-kernel xclbin (e.g. MLIR_AIE)
                if not match:
                    raise DeviceRunError(f"kernel {artifact.kernel!r} not in xclbin (has {names})")
                h.kernel = xrt.kernel(h.context, match[0])
            except DeviceRunError as e:
                raise DeviceRunError(f"module {artifact.name}: {e}") from e
            except Exception as e:
                raise DeviceRunError(f"module {artifact.name}: cannot load xclbin {artifact.xclbin}: {e}") from e
            instr = np.fromfile(str(artifact.insts), dtype=np.uint32)
            h.n_instr = int(instr.size)
            h.instr_bo = xrt.bo(dev, instr.nbytes, xrt.bo.cacheable, h.kernel.group_id(1))
            np.frombuffer(h.instr_bo.map(), dtype=np.uint8)[: instr.nbytes] = instr.view(np.uint8)
            h.instr_bo.sync(_to_device(xrt))
        else:
            raise ValueError(f"module {artifact.name}: artifact has neither an .elf binary nor "
                             f"xclbin + insts; rebuild it with DEVICE=npu")
        self.stats.loads += 1
        return h

    def unload(self, handle: _Loaded) -> None:
        """Drop the module's runs, kernel and hardware context (XRT releases the context with its last
        reference); its buffers are not tied to the context in the ELF flow and stay valid."""
        handle.runs.clear()
        handle.kernel = handle.context = handle.elf = handle.xclbin = handle.instr_bo = None
        self.stats.unloads += 1

    # ---------------------------------------------------------------- buffers
    def alloc(self, nbytes: int) -> NpuBuffer:
        """ELF-flow buffer (xrt.ext.bo), zero-filled and synced so 'zero-initialised' holds."""
        xrt = _xrt()
        buf = NpuBuffer(nbytes, xrt.ext.bo(self.xrt_device, nbytes))
        buf.host = np.frombuffer(buf.bo.map(), dtype=np.uint8)[:nbytes]
        buf.host[:] = 0
        buf.bo.sync(_to_device(xrt))
        self.stats.on_alloc(nbytes)
        return buf

    def view(self, buf: NpuBuffer, offset: int, nbytes: int) -> NpuBuffer:
        """An XRT sub-buffer (`xrt::bo(parent, size, offset)`): the kernel argument address is patched to
        parent + offset at run time, which is how a per-call offset (a KV-cache row) reaches a DMA whose
        instruction stream is fixed at compile time. Shares the parent's host mapping."""
        check_view(buf, offset, nbytes)
        if buf.bo is None:
            raise ValueError("view of a freed or unbound buffer")
        sub = NpuBuffer(nbytes, _xrt().bo(buf.bo, nbytes, offset))
        sub.host = buf.host[offset:offset + nbytes]
        return sub

    def copy(self, dst: NpuBuffer, src: NpuBuffer, nbytes: int) -> None:
        dst.bo.copy(src.bo, nbytes)  # xrt::bo::copy: device-side, no host round trip

    def free(self, buf: Buffer) -> None:
        self.stats.on_free(buf.nbytes)
        buf.host = None
        buf.bo = None

    def write(self, buf: NpuBuffer, data: np.ndarray) -> None:
        raw = check_nbytes(buf, data)
        buf.host[:] = raw
        if buf.bo is not None:
            buf.bo.sync(_to_device(_xrt()))
        else:
            buf.dirty = True
        self.stats.bytes_written += buf.nbytes

    def fill(self, buf: NpuBuffer, writer) -> None:
        """The bo's own mapping is the destination (the reference design's 'the BO IS the weight storage')."""
        writer(buf.host)
        if buf.bo is not None:
            buf.bo.sync(_to_device(_xrt()))
        else:
            buf.dirty = True
        self.stats.bytes_written += buf.nbytes

    def read(self, buf: NpuBuffer, shape, dtype) -> np.ndarray:
        dt = np.dtype(dtype)
        if int(np.prod(shape, dtype=np.int64)) * dt.itemsize != buf.nbytes:
            raise ValueError(f"read of shape {tuple(shape)} {dt} from a buffer of {buf.nbytes} bytes")
        if buf.bo is not None:
            buf.bo.sync(_from_device(_xrt()))
        self.stats.bytes_read += buf.nbytes
        return buf.host.copy().view(dt).reshape(shape)

    # ---------------------------------------------------------------- run
    def _check(self, handle: _Loaded, state) -> None:
        xrt = _xrt()
        completed = getattr(getattr(xrt, "ert_cmd_state", None), "ERT_CMD_STATE_COMPLETED", None)
        if state is None or completed is None or state == completed:
            return
        raise DeviceRunError(f"module {handle.name}: NPU run did not complete: {state}")

    def run(self, handle: _Loaded, buffers: list[Buffer]) -> None:
        xrt = _xrt()
        if handle.flow == "elf":
            key = tuple(id(b) for b in buffers)
            cached = handle.runs.get(key)
            # The cache entry keeps its buffers alive, so an id in the key cannot be reused by a
            # new buffer; the identity check also catches a bo re-created behind the same buffer.
            if cached is not None and all(b.bo is bo for b, bo in zip(buffers, cached[1])):
                run = cached[0]
            else:
                if any(b.bo is None for b in buffers):
                    raise DeviceRunError(f"module {handle.name}: run over a freed buffer")
                run = xrt.run(handle.kernel)
                for i, b in enumerate(buffers):
                    run.set_arg(i, b.bo)
                handle.runs[key] = (run, tuple(b.bo for b in buffers), tuple(buffers))
                while len(handle.runs) > MAX_CACHED_RUNS:  # per-position views make new buffer lists
                    handle.runs.pop(next(iter(handle.runs)))
            run.start()
            state = run.wait2() if hasattr(run, "wait2") else run.wait()
        else:
            self._bind_group_bos(handle, buffers)
            h = handle.kernel(3, handle.instr_bo, handle.n_instr, *[b.bo for b in buffers])
            state = h.wait()
        self._check(handle, state)
        self.stats.runs += 1

    def _bind_group_bos(self, handle: _Loaded, buffers: list[NpuBuffer]) -> None:
        """xclbin flow: data bos must live in the kernel's group_id(i + 3); re-home ELF-style bos
        on first use, carrying over their staged bytes."""
        xrt = _xrt()
        for i, b in enumerate(buffers):
            if getattr(b, "group_owner", None) is handle:
                continue
            if b.bo is not None and b.group_owner is not None:
                # another kernel's output (a ModuleExecutor ref): fetch what its run wrote before re-homing
                b.bo.sync(_from_device(xrt))
            staged = b.host.copy() if b.host is not None else np.zeros(b.nbytes, np.uint8)
            b.bo = xrt.bo(self.xrt_device, b.nbytes, xrt.bo.host_only, handle.kernel.group_id(i + 3))
            b.host = np.frombuffer(b.bo.map(), dtype=np.uint8)[: b.nbytes]
            b.host[:] = staged
            b.bo.sync(_to_device(xrt))
            b.dirty = False
            b.group_owner = handle

    def close(self) -> None:
        self._device = None
