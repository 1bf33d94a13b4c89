"""Where the C++ kernel sources are (in the package) and where llama-npu keeps its caches on this machine."""
from __future__ import annotations

import os
from pathlib import Path

SOURCE_DIR = Path(__file__).resolve().parent      # the AIE2P external kernels (*.cc) and kernel_common.h
HOST_SOURCE_DIR = SOURCE_DIR / "host"             # the emulator's host kernels (*.cc)


def cache_root() -> Path:
    """Root of every llama-npu cache (models, kernels, host libraries): $LLAMA_NPU_CACHE or
    ~/.cache/llama-npu."""
    env = os.environ.get("LLAMA_NPU_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "llama-npu"
