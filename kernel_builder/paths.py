"""Where llama-npu keeps its caches on this machine."""
from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """Root of every llama-npu cache (models, kernels, host libraries): $LLAMA_NPU_CACHE or
    ~/.cache/llama-npu."""
    env = os.environ.get("LLAMA_NPU_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "llama-npu"
