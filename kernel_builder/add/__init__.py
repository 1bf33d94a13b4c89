"""The `add` kernel: its builder, tiling plan, reference and external-kernel descriptor."""
