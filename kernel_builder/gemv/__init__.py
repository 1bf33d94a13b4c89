"""The `gemv` kernel: its builder, tiling plan, reference and external-kernel descriptor."""
