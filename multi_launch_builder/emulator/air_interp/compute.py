"""Whole-buffer compute of the AIR interpreter: `linalg.fill`, `linalg.matmul` (f32 accumulate),
`linalg.generic` (identity maps, all-parallel: the body evaluated on whole arrays) and `func.call` of the external
C++ kernels (each symbol family re-implemented in numpy, kernel_builder.externals)."""
from __future__ import annotations

import re

import numpy as np

from kernel_builder.aie_host_models import model_for
from kernel_builder.external_models import ModelError
from multi_launch_builder.emulator.air_interp.values import F32, InterpError, _SSA, _operand, _operands, _region_span


class ComputeOps:
    """The linalg ops and external calls of `program._Compiler` (`self.block` compiles a generic's body)."""

    # -- calls ------------------------------------------------------------------------------------------------
    def _call(self, op):
        m = re.fullmatch(r"func\.call\s+@([\w$.]+)\((.*?)\)\s*:\s*\((.*)\)\s*->\s*\(\s*\)", op.text.strip(),
                         re.DOTALL)
        if m is None:
            raise InterpError(f"{op.where()}: only `func.call @f(...) : (...) -> ()` is supported")
        sym, args = m.group(1), _operands(m.group(2))
        impl = model_for(sym)
        if impl is None:
            raise InterpError(f"{op.where()}: no interpreter implementation of external kernel @{sym}")
        state_ref = self

        def run(env):
            values = [a(env) for a in args]
            try:
                impl(*values)
            except (InterpError, ModelError) as e:
                raise InterpError(f"{op.where()}: @{sym}: {e}") from None
            st = state_ref.state.stats
            st.calls += 1
            st.calls_by_symbol[sym] = st.calls_by_symbol.get(sym, 0) + 1
        return run

    # -- linalg -----------------------------------------------------------------------------------------------
    def _fill(self, op):
        m = re.fullmatch(rf"linalg\.fill\s+ins\(({_SSA})\s*:\s*\w+\)\s*outs\(({_SSA})\s*:\s*memref<.*>\)",
                         op.text.strip(), re.DOTALL)
        if m is None:
            raise InterpError(f"{op.where()}: unsupported linalg.fill form")
        v, out = _operand(m.group(1)), _operand(m.group(2))

        def run(env):
            mr = out(env)
            mr.data[:] = v(env)
            mr.written = True
        return run

    def _matmul(self, op):
        m = re.fullmatch(rf"linalg\.matmul\s+ins\(({_SSA})\s*,\s*({_SSA})\s*:.*?\)\s*outs\(({_SSA})\s*:.*\)",
                         op.text.strip(), re.DOTALL)
        if m is None:
            raise InterpError(f"{op.where()}: unsupported linalg.matmul form")
        a, b, c = (_operand(m.group(i)) for i in (1, 2, 3))

        def run(env):
            ma, mb, mc = a(env), b(env), c(env)
            (mm, kk), (k2, nn), (m2, n2) = ma.shape, mb.shape, mc.shape
            if kk != k2 or mm != m2 or nn != n2:
                raise InterpError(f"linalg.matmul shapes {ma.shape} x {mb.shape} -> {mc.shape}")
            if mc.dtype != "f32":
                raise InterpError("linalg.matmul: only an f32 accumulator is supported")
            acc = mc.data.reshape(mm, nn)
            acc += ma.data.reshape(mm, kk).astype(F32) @ mb.data.reshape(kk, nn).astype(F32)
            mc.written = True
        return run

    def _generic(self, op):
        head_end = _region_span(op)[0] - 1
        head = op.full[:head_end]
        maps = re.findall(r"affine_map<\(([^)]*)\)\s*->\s*\(([^)]*)\)>", head)
        if not maps or any(d.replace(" ", "") != r.replace(" ", "") for d, r in maps):
            raise InterpError(f"{op.where()}: linalg.generic: only identity indexing maps are supported")
        iters = re.search(r"iterator_types\s*=\s*\[([^\]]*)\]", head)
        if iters is None or any(t.strip() != '"parallel"' for t in iters.group(1).split(",")):
            raise InterpError(f"{op.where()}: linalg.generic: only parallel iterators are supported")
        mi = re.search(r"ins\(([^:]*):[^)]*\)", head)
        mo = re.search(r"outs\(([^:]*):[^)]*\)", head)
        if mi is None or mo is None:
            raise InterpError(f"{op.where()}: linalg.generic without ins/outs")
        ins, outs = _operands(mi.group(1)), _operands(mo.group(1))
        mb = op.block_label
        if mb is None:
            raise InterpError(f"{op.where()}: linalg.generic: expected a `^bb0(...)` block header")
        bargs = [p.split(":")[0].strip() for p in mb.group(1).split(",")]
        if len(bargs) != len(ins) + len(outs):
            raise InterpError(f"{op.where()}: linalg.generic block has {len(bargs)} args for "
                              f"{len(ins) + len(outs)} operands")
        fns, term = self.block(op.body, terminators=("linalg.yield",))
        if term is None:
            raise InterpError(f"{op.where()}: linalg.generic without linalg.yield")
        ym = re.fullmatch(r"linalg\.yield\s+(.*?)\s*:\s*(.*)", term.text.strip(), re.DOTALL)
        yields = _operands(ym.group(1))
        if len(yields) != len(outs):
            raise InterpError(f"{term.where()}: {len(yields)} yielded values for {len(outs)} outputs")

        def run(env):
            in_m = [f(env) for f in ins]
            out_m = [f(env) for f in outs]
            shape = out_m[0].shape
            if any(x.shape != shape for x in in_m + out_m):
                raise InterpError(f"linalg.generic operand shapes differ: {[x.shape for x in in_m + out_m]}")
            local = dict(env)
            for name, x in zip(bargs, in_m + out_m):
                local[name] = x.data  # whole arrays: the body is evaluated elementwise by numpy
            for fn in fns:
                fn(local)
            for y, o in zip(yields, out_m):
                o.data[:] = np.broadcast_to(y(local), o.data.shape)
                o.written = True
        return run
