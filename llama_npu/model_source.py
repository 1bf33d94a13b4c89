"""Turn what the user typed (--model / MODEL=...) into a local Hugging Face model directory.

Accepted, in order: nothing (the embedded SmolLM2 default), a directory path, or a model id
("org/name") already present in the local Hugging Face cache. Resolution never touches the network.
"""
from __future__ import annotations

import os
import re
from pathlib import Path

from .errors import ModelNotFound

EMBEDDED_ALIASES = ("", "embedded", "default", "smollm2-135m-instruct")
_MODEL_ID = re.compile(r"^[A-Za-z0-9][\w.\-]*/[\w.\-]+$")


def hub_cache_dir() -> Path:
    """The hub cache root huggingface_hub uses, read from the environment at call time (its own constant is
    fixed at import): $HF_HUB_CACHE, else $HF_HOME/hub, else ~/.cache/huggingface/hub."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    return Path.home() / ".cache" / "huggingface" / "hub"


def find_in_hf_cache(model_id: str) -> Path | None:
    """The cached snapshot of `model_id` (the revision `main` points to), looked up by huggingface_hub
    offline; None when it is not in the cache."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        path = Path(snapshot_download(model_id, local_files_only=True, cache_dir=hub_cache_dir()))
    except (LocalEntryNotFoundError, OSError, ValueError):
        return None
    return path if (path / "config.json").is_file() else None


def resolve_model(model: str | os.PathLike | None = None, progress: bool = True) -> Path:
    """Return a local directory holding config.json (+ weights, tokenizer). Raises ModelNotFound."""
    text = "" if model is None else str(model).strip()
    if text.lower() in EMBEDDED_ALIASES:
        from .embedded import ensure_embedded

        return ensure_embedded(progress=progress)
    path = Path(text).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelNotFound(f"model directory {path} has no config.json (not a Hugging Face model directory)")
        return path.resolve()
    if path.is_file() and path.suffix.lower() == ".gguf":
        from .embedded import ensure_gguf_converted

        return ensure_gguf_converted(path, progress=progress)
    if path.exists():
        raise ModelNotFound(f"model path {path} is a file; pass the model's directory (with config.json) "
                            f"or a .gguf file")
    if _MODEL_ID.match(text) and not text.startswith((".", "/", "~")):
        snap = find_in_hf_cache(text)
        if snap is not None:
            return snap
        raise ModelNotFound(
            f"model {text!r} is neither a directory nor in the local Hugging Face cache ({hub_cache_dir()}); "
            f"download it first, e.g. `huggingface-cli download {text}`")
    raise ModelNotFound(f"model path {text} does not exist")
