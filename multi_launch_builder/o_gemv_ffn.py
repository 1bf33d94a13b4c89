"""Decode layer tail for one token: O GEMV -> residual add -> RMSNorm -> gate/up GEMVs -> SwiGLU ->
down GEMV -> residual add (8 launches). Weights in HF (out, in) layout."""
from __future__ import annotations

from multi_launch_builder import kernel
from multi_launch_builder.decl import Arg, Launch, ModuleDecl, Role
from multi_launch_builder.shapes import ModelShapes


def o_gemv_ffn(shapes: ModelShapes) -> ModuleDecl:
    h, q, f = shapes.hidden, shapes.q_dim, shapes.ffn
    return ModuleDecl(
        name="o_gemv_ffn",
        args=(
            Arg("attn", (1, q), Role.INPUT),
            Arg("wo", (h, q), Role.STATIC),
            Arg("proj", (1, h), Role.INTERMEDIATE),
            Arg("x", (1, h), Role.INPUT),
            Arg("res1", (1, h), Role.INTERMEDIATE),
            Arg("ffn_norm_w", (h,), Role.STATIC),
            Arg("normed2", (1, h), Role.INTERMEDIATE),
            Arg("w_gate", (f, h), Role.STATIC),
            Arg("gate", (1, f), Role.INTERMEDIATE),
            Arg("w_up", (f, h), Role.STATIC),
            Arg("up", (1, f), Role.INTERMEDIATE),
            Arg("hidden_act", (1, f), Role.INTERMEDIATE),
            Arg("w_down", (h, f), Role.STATIC),
            Arg("down", (1, h), Role.INTERMEDIATE),
            Arg("x_out", (1, h), Role.OUTPUT),
        ),
        launches=(
            Launch("o", kernel("gemv", h, q), ("wo", "attn", "proj")),
            Launch("add1", kernel("add", 1, h), ("x", "proj", "res1")),
            Launch("rms", kernel("rmsnorm", 1, h, shapes.rms_eps), ("res1", "ffn_norm_w", "normed2")),
            Launch("gate", kernel("gemv", f, h), ("w_gate", "normed2", "gate")),
            Launch("up", kernel("gemv", f, h), ("w_up", "normed2", "up")),
            Launch("swiglu", kernel("swiglu", 1, f), ("gate", "up", "hidden_act")),
            Launch("down", kernel("gemv", h, f), ("w_down", "hidden_act", "down")),
            Launch("add2", kernel("add", 1, h), ("res1", "down", "x_out")),
        ),
    )
