"""A supported architecture: the Hugging Face class name, its description class and what its config.json adds to
the common Llama checks (llama_npu.config). One `FAMILY` per description file; llama_npu.models.ARCHITECTURES is
the table keyed by architecture name."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..errors import UnsupportedModel


def no_options(cfg: dict, path: Path) -> dict:
    return {}


@dataclass(frozen=True)
class Family:
    """`options(config, path) -> dict` reads the family's own keys (raising UnsupportedModel for what we do not
    implement) and returns what they set: `rotary_dim` (ModelShapes), `sliding_window` (the attention op's
    window, LlamaModel.sliding_window). `honours_sliding_window`: the family's `sliding_window` key is read (else a set window with
    use_sliding_window, or non-full layer_types, are refused)."""

    architecture: str
    model_type: str
    model: type
    differs: str
    options: Callable[[dict, Path], dict] = no_options
    honours_sliding_window: bool = False


def sliding_window_option(cfg: dict, path: Path) -> dict:
    """`sliding_window` (Mistral, Phi-3): key j is visible to query i when i - window < j <= i (the attention
    kernel's `window`)."""
    w = cfg.get("sliding_window")
    if w is None:
        return {}
    if isinstance(w, bool) or not isinstance(w, int) or w <= 0:
        raise UnsupportedModel(f"{path}: sliding_window must be a positive integer or null, got {w!r}")
    return {"sliding_window": w}
