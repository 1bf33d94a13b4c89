"""Fixtures for the runtime tests: small checkpoints on disk, shared per session."""
from __future__ import annotations

import pytest

from checkpoints import make_hf_checkpoint, write_numpy_checkpoint


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A valid 1-layer Llama checkpoint written without torch (context 256)."""
    return write_numpy_checkpoint(tmp_path_factory.mktemp("tiny") / "model")


@pytest.fixture(scope="session")
def kernel_cache_dir(tmp_path_factory):
    """One kernel cache for the whole session, so each module shape is built once."""
    return tmp_path_factory.mktemp("kernels")


@pytest.fixture(scope="session")
def hf_checkpoint(tmp_path_factory):
    """Factory: make_hf_checkpoint(**kwargs) cached per parameter set (needs torch + transformers)."""
    from tooling import require_module

    require_module("torch")
    require_module("transformers")
    made = {}

    def make(**kwargs):
        key = repr(sorted(kwargs.items()))
        if key not in made:
            made[key] = make_hf_checkpoint(tmp_path_factory.mktemp("hf") / "model", **kwargs)
        return made[key]

    return make
