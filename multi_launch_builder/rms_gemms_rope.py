"""Prefill attention front: RMSNorm -> Q/K/V GEMMs -> RoPE on Q and K (6 launches, one dispatch)."""
from __future__ import annotations

from multi_launch_builder import kernel
from multi_launch_builder.decl import Arg, Launch, ModuleDecl, Role
from multi_launch_builder.shapes import ModelShapes


def rms_gemms_rope(shapes: ModelShapes, seq: int) -> ModuleDecl:
    h, q, kv, hd = shapes.hidden, shapes.q_dim, shapes.kv_dim, shapes.head_dim
    return ModuleDecl(
        name=f"rms_gemms_rope_s{seq}",
        family="rms_gemms_rope",  # one copy of each layer's weights for every bucket
        args=(
            Arg("x", (seq, h), Role.INPUT),
            Arg("norm_w", (h,), Role.STATIC),
            Arg("normed", (seq, h), Role.INTERMEDIATE),
            Arg("wq", (h, q), Role.STATIC),
            Arg("q", (seq, q), Role.INTERMEDIATE),
            Arg("wk", (h, kv), Role.STATIC),
            Arg("k", (seq, kv), Role.INTERMEDIATE),
            Arg("wv", (h, kv), Role.STATIC),
            Arg("v", (seq, kv), Role.OUTPUT),
            Arg("lut", (seq, hd), Role.STATIC),
            Arg("q_roped", (seq, q), Role.OUTPUT),
            Arg("k_roped", (seq, kv), Role.OUTPUT),
        ),
        launches=(
            Launch("rms", kernel("rmsnorm", seq, h, shapes.rms_eps), ("x", "norm_w", "normed")),
            Launch("q", kernel("gemm", seq, h, q), ("normed", "wq", "q")),
            Launch("k", kernel("gemm", seq, h, kv), ("normed", "wk", "k")),
            Launch("v", kernel("gemm", seq, h, kv), ("normed", "wv", "v")),
            Launch("rope_q", kernel("rope", seq, shapes.n_heads, hd), ("q", "lut", "q_roped")),
            Launch("rope_k", kernel("rope", seq, shapes.n_kv_heads, hd), ("k", "lut", "k_roped")),
        ),
    )
