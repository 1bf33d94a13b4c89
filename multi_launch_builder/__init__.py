"""One declaration per multi-launch module (see decl.py and docs/stitching.md).

`kernel_text(kind, *args, **kwargs)` is the memoised entry point to the kernel builders: identical
(kind, shape) kernels - the four same-shape GEMMs of a layer, the LM-head partitions, the same kernel in
prefill modules of several buckets - are generated once per process.
"""
from __future__ import annotations

import functools
import importlib


@functools.lru_cache(maxsize=None)
def kernel_text(kind: str, *args, **kwargs) -> str:
    """`kernel_builder.kernels.<kind>.build(*args, **kwargs)`, cached."""
    return importlib.import_module(f"kernel_builder.kernels.{kind}").build(*args, **kwargs)


def kernel(kind: str, *args, **kwargs):
    """A zero-argument factory for Launch.build."""
    return functools.partial(kernel_text, kind, *args, **kwargs)


def clear_kernel_cache() -> None:
    kernel_text.cache_clear()
