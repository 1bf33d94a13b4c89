"""An interpreter for the AIR module text our builders and the stitcher emit.

The `emu` device computes each launch with the kernel's numpy reference: wiring comes from the text, but a
herd body is never looked at, so a wrong DMA offset/size/stride, a herd that covers the wrong rows or a wrong
loop bound goes unnoticed. This interpreter executes the text itself:

- `func.func` body, `air.launch` (its grid iterated), `air.segment`, `air.herd` (tiles run one after the other:
  they are independent), `scf.for` (with `iter_args` / `scf.yield`);
- `arith` / `math` scalars, `memref.alloc/dealloc/load/store`, `linalg.fill`, `linalg.matmul` (f32
  accumulate), `linalg.generic` (identity maps, all-parallel: evaluated on whole arrays);
- `air.dma_memcpy_nd` with offsets/sizes/strides on both sides (AIR semantics: lists outermost first, in
  elements; element i of dimension d is at (offset_d + i) * stride_d; `[] [] []` = whole buffer, contiguous);
  every index is bounds checked, so a tiling bug that reads past a buffer fails loudly;
- `air.channel` declarations (module level, optional `broadcast_shape`) and synchronous
  `air.channel.put` / `air.channel.get` (a FIFO per channel index: see `channels`);
- `func.call` of the external C++ kernels (external_kernels/*.cc): each symbol family is
  re-implemented in numpy following the host scalar path (f32 math in the same order, RNE bf16 stores).

`compile_module(text)` parses once into closures; `Program.run(args)` executes on memrefs that wrap the
caller's arrays in place. Anything outside this subset raises `InterpError` naming the op and its line.

Modules, each one job: `values` (memrefs, operand readers, run statistics and state), `scalars` (arith/math),
`memory` (memref ops, `air.dma_memcpy_nd` and the access patterns both DMAs and channels use), `channels`
(`air.channel.put/get`), `compute` (linalg ops, external kernel calls) and `program` (blocks, `scf.for`, the
AIR regions, `Program` and `compile_module`); their public names are re-exported here.
"""
from multi_launch_builder.emulator.air_interp.program import Program, compile_module
from multi_launch_builder.emulator.air_interp.values import (DTYPES, F32, L1_SPACE, Env, Fn, InterpError, MemRef, Stats,
                                                             parse_memref_type)

__all__ = ["InterpError", "MemRef", "Stats", "Program", "compile_module", "parse_memref_type", "DTYPES", "F32",
           "L1_SPACE", "Env", "Fn"]
