"""User-facing errors: each one is a single line that the CLI prints without a traceback."""
from __future__ import annotations


class LlamaNpuError(Exception):
    """Base class; `str(err)` is the one-line message shown to the user."""


class ModelNotFound(LlamaNpuError):
    """The model path / id could not be resolved to a local HF directory."""


class UnsupportedModel(LlamaNpuError):
    """config.json describes something that is not the Llama math we implement."""


class WeightsError(LlamaNpuError):
    """A safetensors file is truncated/corrupt or a tensor is missing / mis-shaped."""


class TokenizerError(LlamaNpuError):
    """No usable tokenizer / chat template in the model directory."""


class PromptError(LlamaNpuError):
    """Empty prompt, or prompt + new tokens beyond the model's context / compiled buckets."""


class MissingDependency(LlamaNpuError):
    """An optional dependency (e.g. the `verify` extra for GGUF conversion) is not installed."""


class UsageError(LlamaNpuError):
    """A command-line value that argparse cannot check on its own (e.g. $DEVICE)."""


class ContextError(LlamaNpuError):
    """The requested context (KV-cache positions) is invalid or does not fit in memory."""
