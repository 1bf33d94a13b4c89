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


def hf_cache_dirs() -> list[Path]:
    """Hub cache roots in the order huggingface_hub itself honours them."""
    dirs: list[Path] = []
    if os.environ.get("HF_HUB_CACHE"):
        dirs.append(Path(os.environ["HF_HUB_CACHE"]).expanduser())
    if os.environ.get("HUGGINGFACE_HUB_CACHE"):
        dirs.append(Path(os.environ["HUGGINGFACE_HUB_CACHE"]).expanduser())
    if os.environ.get("HF_HOME"):
        dirs.append(Path(os.environ["HF_HOME"]).expanduser() / "hub")
    dirs.append(Path.home() / ".cache" / "huggingface" / "hub")
    return list(dict.fromkeys(dirs))


def _snapshot(repo_dir: Path) -> Path | None:
    """The snapshot `refs/main` points to, else the most recent snapshot holding a config.json."""
    snaps = repo_dir / "snapshots"
    ref = repo_dir / "refs" / "main"
    if ref.is_file():
        cand = snaps / ref.read_text().strip()
        if (cand / "config.json").is_file():
            return cand
    found = [d for d in snaps.glob("*") if (d / "config.json").is_file()] if snaps.is_dir() else []
    return max(found, key=lambda d: d.stat().st_mtime) if found else None


def find_in_hf_cache(model_id: str) -> Path | None:
    folder = "models--" + model_id.replace("/", "--")
    for root in hf_cache_dirs():
        snap = _snapshot(root / folder)
        if snap is not None:
            return snap
    return None


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
    if path.exists():
        raise ModelNotFound(f"model path {path} is a file; pass the model's directory (with config.json)")
    if _MODEL_ID.match(text) and not text.startswith((".", "/", "~")):
        snap = find_in_hf_cache(text)
        if snap is not None:
            return snap
        looked = ", ".join(str(d) for d in hf_cache_dirs())
        raise ModelNotFound(
            f"model {text!r} is neither a directory nor in the local Hugging Face cache (looked in {looked}); "
            f"download it first, e.g. `huggingface-cli download {text}`")
    raise ModelNotFound(f"model path {text} does not exist")
