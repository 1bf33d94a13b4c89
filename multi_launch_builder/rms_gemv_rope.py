"""Decode attention front for one token: RMSNorm -> Q/K/V GEMVs -> RoPE on Q and K (6 launches).
Weights are in HF (out, in) layout; the LUT row of the current position is an input."""
from __future__ import annotations

from multi_launch_builder import kernel
from multi_launch_builder.decl import Arg, Launch, ModuleDecl, Role
from multi_launch_builder.shapes import ModelShapes


def rms_gemv_rope(shapes: ModelShapes) -> ModuleDecl:
    h, q, kv, hd = shapes.hidden, shapes.q_dim, shapes.kv_dim, shapes.head_dim
    return ModuleDecl(
        name="rms_gemv_rope",
        args=(
            Arg("x", (1, h), Role.INPUT),
            Arg("norm_w", (h,), Role.STATIC),
            Arg("normed", (1, h), Role.INTERMEDIATE),
            Arg("wq", (q, h), Role.STATIC),
            Arg("q", (1, q), Role.INTERMEDIATE),
            Arg("wk", (kv, h), Role.STATIC),
            Arg("k", (1, kv), Role.INTERMEDIATE),
            Arg("wv", (kv, h), Role.STATIC),
            Arg("v", (1, kv), Role.OUTPUT),
            Arg("lut", (1, hd), Role.INPUT),
            Arg("q_roped", (1, q), Role.OUTPUT),
            Arg("k_roped", (1, kv), Role.OUTPUT),
        ),
        launches=(
            Launch("rms", kernel("rmsnorm", 1, h, shapes.rms_eps), ("x", "norm_w", "normed")),
            Launch("q", kernel("gemv", q, h), ("wq", "normed", "q")),
            Launch("k", kernel("gemv", kv, h), ("wk", "normed", "k")),
            Launch("v", kernel("gemv", kv, h), ("wv", "normed", "v")),
            Launch("rope_q", kernel("rope", 1, shapes.n_heads, hd), ("q", "lut", "q_roped")),
            Launch("rope_k", kernel("rope", 1, shapes.n_kv_heads, hd), ("k", "lut", "k_roped")),
        ),
    )
