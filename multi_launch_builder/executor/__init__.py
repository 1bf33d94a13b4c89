"""ModuleExecutor, the run-time executor of compiled modules: one loaded binary per module, one buffer set per
bo_key. (The compiled-artifact store is multi_launch_builder.compile.store.)

Transfer contract (roles come from the ModuleDecl, never re-typed; docs/cache.md):
- input        : written by the host on every call, or bound to another module's buffer (`ref`, 0 bytes);
- static       : written on the first call of a bo_key (or by write_static), then kept;
- state        : a window of a persistent buffer (per bo_key or shared), starting at the row a scalar names;
                 kernels read and write it in place; the host never transfers it unless asked (read_state);
- scalar       : one i32 per call (4 bytes, not re-sent while unchanged);
- intermediate : device-only, never transferred (zero on allocation);
- output       : never written by the host; read back after a call (`read=` selects which).
Counters are exact: bytes_written / bytes_read are the bytes actually transferred.

Buffer sharing (device memory): a static buffer belongs to (module family, bo_key, arg name, shape, dtype);
input, intermediate, output and scalar buffers belong to the module and are shared by all its bo_keys
(calls run one at a time); state buffers belong to (state name, bo_key) or to the state name alone.

Hand-off policy: with handoff="device" (default) a ref binds the producer's buffer; with handoff="host"
the same call copies it through the host (read back, written into the consumer's own buffer, counted), so
the runtime has one code path and the policy decides where activations travel.

Four modules: `runner` (ModuleExecutor: loads modules, runs calls, counts bytes), `buffers` (device buffers:
pools, buffer sets, views), `state` (STATE buffers and their windows) and `binding` (argument checks, refs,
aliasing); the public names are re-exported here.
"""
from multi_launch_builder.executor.binding import DeviceRef
from multi_launch_builder.executor.runner import HANDOFFS, ModuleExecutor, ModuleCounters

__all__ = ["ModuleExecutor", "DeviceRef", "ModuleCounters", "HANDOFFS"]
