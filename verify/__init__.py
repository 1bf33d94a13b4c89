"""Verification against HF transformers: the top-k token gate (`python -m verify verify`) and the
per-layer drift lens (`python -m verify diagnosis`). See docs/verification.md."""
