"""Memory ops of the AIR interpreter: `memref.alloc/dealloc/load/store`, `air.dma_memcpy_nd` and the
offsets/sizes/strides access patterns (bounds checked) that DMAs and channel ops read and write through."""
from __future__ import annotations

import re

import numpy as np

from kernel_builder import mlir_text as mt
from multi_launch_builder.emulator.air_interp.values import (DTYPES, InterpError, MemRef, _SSA, _operand, _operands,
                                                             _top_groups, parse_memref_type)


class MemoryOps:
    """The memref and DMA ops of `program._Compiler` (its run state is `self.state`)."""

    # -- memref ---------------------------------------------------------------------------------------------
    def _alloc(self, op):
        m = re.fullmatch(r"memref\.alloc\(\)\s*:\s*(memref<.*>)", op.text.strip(), re.DOTALL)
        if m is None:
            raise InterpError(f"{op.where()}: only `memref.alloc() : memref<static shape>` is supported")
        t = parse_memref_type(m.group(1))
        res, dt = op.results[0], DTYPES[t.dtype]

        def run(env):
            # Uninitialised memory on the device: NaN-filled floats make a read-before-write visible.
            data = np.full(t.size, np.nan, dtype=dt) if dt.kind == "f" or t.dtype == "bf16" \
                else np.zeros(t.size, dtype=dt)
            mr = MemRef(data, t.shape, t.dtype, t.space, res)
            env[res] = mr
            self.state.on_alloc(mr)
        return run

    def _dealloc(self, op):
        m = re.fullmatch(rf"memref\.dealloc\s+({_SSA})\s*:\s*.*", op.text.strip(), re.DOTALL)
        a = _operand(m.group(1))

        def run(env):
            self.state.on_dealloc(a(env))
        return run

    @staticmethod
    def _flat_index(mr: MemRef, idx: list[int]) -> int:
        if len(idx) != len(mr.shape):
            raise InterpError(f"{len(idx)} indices for a rank-{len(mr.shape)} memref")
        flat = 0
        for i, d, s in zip(idx, mr.shape, mr.strides):
            if not 0 <= i < d:
                raise InterpError(f"index {idx} out of bounds for memref shape {mr.shape}")
            flat += i * s
        return flat

    def _load(self, op):
        m = re.fullmatch(rf"memref\.load\s+({_SSA})\[(.*?)\]\s*(?:\{{(.*?)\}}\s*)?:\s*(memref<.*>)", op.text.strip(),
                         re.DOTALL)
        if m is None:
            raise InterpError(f"{op.where()}: unsupported memref.load form")
        buf, idx, res = _operand(m.group(1)), _operands(m.group(2)), op.results[0]
        flat = self._flat_index
        # `llama_npu.range = [lo, hi]`: the values the builder promises (the hardware model costs the work at
        # them); a value outside is a builder or caller error
        rng = re.search(r"llama_npu\.range\s*=\s*\[\s*(-?\d+)\s*,\s*(-?\d+)\s*\]", m.group(3) or "")
        lo, hi = (int(rng.group(1)), int(rng.group(2))) if rng else (None, None)
        where = op.where()

        def run(env):
            mr = buf(env)
            val = mr.data[flat(mr, [f(env) for f in idx])]
            if lo is not None and not lo <= int(val) <= hi:
                raise InterpError(f"{where}: loaded {int(val)} outside its declared llama_npu.range [{lo}, {hi}]")
            env[res] = val
        return run

    def _store(self, op):
        m = re.fullmatch(rf"memref\.store\s+({_SSA})\s*,\s*({_SSA})\[(.*?)\]\s*:\s*(memref<.*>)", op.text.strip(),
                         re.DOTALL)
        if m is None:
            raise InterpError(f"{op.where()}: unsupported memref.store form")
        val, buf, idx = _operand(m.group(1)), _operand(m.group(2)), _operands(m.group(3))
        flat = self._flat_index

        def run(env):
            mr = buf(env)
            mr.data[flat(mr, [f(env) for f in idx])] = val(env)
            mr.written = True
        return run

    # -- air.dma_memcpy_nd ------------------------------------------------------------------------------------
    def _dma(self, op):
        body = op.text.strip()[len("air.dma_memcpy_nd"):].strip()
        if body.startswith("async") or body.startswith("["):
            raise InterpError(f"{op.where()}: async air.dma_memcpy_nd is not supported")
        groups = _top_groups(body)
        if not groups or groups[0][0] != "(":
            raise InterpError(f"{op.where()}: expected `(dst..., src...)`")
        inner = body[groups[0][1] + 1:groups[0][2] - 1]
        sides = mt.split_top_level(inner)
        if len(sides) != 2:
            raise InterpError(f"{op.where()}: expected two access patterns, found {len(sides)}")
        dst, src = (self._access(op, s) for s in sides)
        state_ref = self

        def run(env):
            d, di = dst(env)
            s, si = src(env)
            if d.dtype != s.dtype:   # a DMA moves bytes: element types may differ when the byte counts agree
                if di.size * d.data.itemsize != si.size * s.data.itemsize:
                    raise InterpError(f"{op.where()}: DMA moves {si.size * s.data.itemsize} bytes from {s.name} "
                                      f"({s.dtype}) but writes {di.size * d.data.itemsize} into {d.name} ({d.dtype})")
                d.data[di] = np.ascontiguousarray(s.data[si]).view(d.data.dtype).reshape(di.shape)
            elif di.size != si.size:
                raise InterpError(f"{op.where()}: DMA moves {si.size} elements from {s.name} but writes "
                                  f"{di.size} into {d.name}")
            else:
                d.data[di] = s.data[si]
            d.written = True
            st = state_ref.state.stats
            st.dmas += 1
            st.dma_bytes += di.size * d.data.itemsize
        return run

    def _access(self, op, text: str):
        m = re.fullmatch(rf"({_SSA})\s*\[(.*?)\]\s*\[(.*?)\]\s*\[(.*?)\]", text.strip(), re.DOTALL)
        if m is None:
            raise InterpError(f"{op.where()}: cannot read access pattern {text!r}")
        buf = _operand(m.group(1))
        offs, sizes, strides = (_operands(m.group(i)) for i in (2, 3, 4))
        if not (len(offs) == len(sizes) == len(strides)):
            raise InterpError(f"{op.where()}: offsets/sizes/strides of {m.group(1)} differ in length")
        cache: dict = {}

        def resolve(env):
            mr: MemRef = buf(env)
            if not isinstance(mr, MemRef):
                raise InterpError(f"{op.where()}: {m.group(1)} is not a memref")
            n = mr.data.size
            if not offs:
                key = ("all", n)
            else:
                key = tuple(f(env) for f in offs) + tuple(f(env) for f in sizes) + tuple(f(env) for f in strides) \
                    + (n,)
            idx = cache.get(key)
            if idx is None:
                if not offs:
                    idx = np.arange(n)
                else:
                    k = len(offs)
                    o, s, t = key[:k], key[k:2 * k], key[2 * k:3 * k]
                    if any(v <= 0 for v in s):
                        raise InterpError(f"{op.where()}: non-positive DMA size {list(s)} on {m.group(1)}")
                    idx = np.zeros((), dtype=np.int64)
                    for off, size, stride in zip(o, s, t):
                        idx = idx[..., None] + (off + np.arange(size, dtype=np.int64)) * stride
                    idx = idx.reshape(-1)
                    lo, hi = int(idx.min()), int(idx.max())
                    if lo < 0 or hi >= n:
                        raise InterpError(
                            f"{op.where()}: access {m.group(1)} offsets {list(o)} sizes {list(s)} strides "
                            f"{list(t)} touches element {lo if lo < 0 else hi} of a {n}-element buffer "
                            f"(shape {mr.shape})")
                if len(cache) < 4096:
                    cache[key] = idx
            return mr, idx
        return resolve
