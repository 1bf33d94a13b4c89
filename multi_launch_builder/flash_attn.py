"""Prefill attention: one FlashAttention launch, its own module (its many channels make stitching it with
other launches prohibitively slow to compile; see the reference design, B5)."""
from __future__ import annotations

from multi_launch_builder import kernel
from multi_launch_builder.decl import Arg, Launch, ModuleDecl, Role
from multi_launch_builder.shapes import ModelShapes


def flash_attn(shapes: ModelShapes, seq: int) -> ModuleDecl:
    q, kv = shapes.q_dim, shapes.kv_dim
    return ModuleDecl(
        name=f"flash_attn_s{seq}",
        family="flash_attn",
        args=(
            Arg("q", (seq, q), Role.INPUT),
            Arg("k", (seq, kv), Role.INPUT),
            Arg("v", (seq, kv), Role.INPUT),
            Arg("attn", (seq, q), Role.OUTPUT),
        ),
        launches=(
            Launch("fa", kernel("flash_attn", seq, shapes.n_heads, shapes.n_kv_heads, shapes.head_dim,
                                causal=True), ("q", "k", "v", "attn")),
        ),
    )
