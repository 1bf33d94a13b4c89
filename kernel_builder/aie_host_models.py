"""emu-interp's external calls through the kernels' AIE2P vector path instead of the numpy models of their scalar
path: with LLAMA_NPU_EXTERNALS=aie-host, `model_for(symbol)` (what the interpreter calls) returns a function that
calls the symbol in its host-aie_api build (kernel_builder.aie_host, docs/aie-api-host.md) on 64-byte aligned
copies of the interpreter's L1 buffers and copies back the operands the kernel writes (external_costs' `writes`).
Errors the host aie_api reports (a misaligned vector access...) become the interpreter's ModelError, naming the
call."""
from __future__ import annotations

import os

import numpy as np

from kernel_builder import aie_host
from kernel_builder import externals as ext
from kernel_builder.external_costs import external_cost
from kernel_builder.external_models import ModelError
from external_kernels.compile_rules import ExternalKernel
from kernel_builder.attention import external as attention_external
from kernel_builder.gemm.external import gemm_kernels

ENV = "LLAMA_NPU_EXTERNALS"


def enabled() -> bool:
    value = os.environ.get(ENV, "").strip().lower()
    if value not in ("", "numpy", "aie-host"):
        raise ValueError(f"{ENV}={value!r}: expected 'numpy' (the default) or 'aie-host'")
    return value == "aie-host"


def model_for(symbol: str):
    """The interpreter's implementation of an external symbol: its vector path under LLAMA_NPU_EXTERNALS=aie-host,
    else the numpy model of its scalar path (externals.external_model); None when no family names it."""
    return vector_model(symbol) if enabled() else ext.external_model(symbol)


def kernel_for_symbol(symbol: str) -> ExternalKernel | None:
    """The kernel object (one compile) that holds `symbol`, or None."""
    found = ext.family_of_symbol(symbol)
    if found is None:
        return None
    fam, p = found
    if fam.name == "attention":           # (mode, part, hd, lq, lk, n)
        return attention_external._attention(p[0], p[2], p[3], p[4], p[5] or 0).init
    if fam.name.startswith("gemm_bfp"):   # gemm_bfp, gemm_bfp_bias: (part, m, k, n), gemm_bfp.cc's object
        return gemm_kernels(p[1], p[2], p[3], "bfp16", c="bfp16" if fam.name == "gemm_bfpc" else "bf16").zero
    if fam.name.startswith("gemm"):       # gemm, gemm_swiglu, gemm_bias: (part, m, k, n), one object
        return gemm_kernels(p[1], p[2], p[3]).zero
    return fam.from_object(*p)            # the other families name their object by the same parameters


def vector_model(symbol: str):
    kernel, cost = kernel_for_symbol(symbol), external_cost(symbol)
    if kernel is None or cost is None:
        return None
    writes = set(cost[0].writes)
    lib = aie_host.load(kernel)

    def call(*args):
        copies, c_args = {}, []
        for i, a in enumerate(args):
            if hasattr(a, "written"):          # a memref (numpy scalars have .data too)
                copies[i] = aie_host.aligned(np.ascontiguousarray(a.data))
                c_args.append(copies[i])
            elif isinstance(a, (int, np.integer)):
                c_args.append(int(a))
            else:
                c_args.append(float(a))
        try:
            lib.call(symbol, *c_args)
        except aie_host.AieHostError as e:
            raise ModelError(str(e)) from None
        for i in writes & copies.keys():
            args[i].data[...] = copies[i]
            args[i].written = True
    return call
