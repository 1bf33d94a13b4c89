"""Prefill layer tail: O GEMM -> residual add -> RMSNorm -> gate/up GEMMs -> SwiGLU -> down GEMM ->
residual add (8 launches). The last add writes the flat [seq*hidden] layer output."""
from __future__ import annotations

from multi_launch_builder import kernel
from multi_launch_builder.decl import Arg, Launch, ModuleDecl, Role
from multi_launch_builder.shapes import ModelShapes


def o_ffn(shapes: ModelShapes, seq: int) -> ModuleDecl:
    h, q, f = shapes.hidden, shapes.q_dim, shapes.ffn
    return ModuleDecl(
        name=f"o_ffn_s{seq}",
        family="o_ffn",  # one copy of each layer's weights for every bucket
        args=(
            Arg("attn", (seq, q), Role.INPUT),
            Arg("wo", (q, h), Role.STATIC),
            Arg("proj", (seq, h), Role.INTERMEDIATE),
            Arg("x", (seq, h), Role.INPUT),
            Arg("res1", (seq, h), Role.INTERMEDIATE),
            Arg("ffn_norm_w", (h,), Role.STATIC),
            Arg("normed2", (seq, h), Role.INTERMEDIATE),
            Arg("w_gate", (h, f), Role.STATIC),
            Arg("gate", (seq, f), Role.INTERMEDIATE),
            Arg("w_up", (h, f), Role.STATIC),
            Arg("up", (seq, f), Role.INTERMEDIATE),
            Arg("hidden_act", (seq, f), Role.INTERMEDIATE),
            Arg("w_down", (f, h), Role.STATIC),
            Arg("down", (seq, h), Role.INTERMEDIATE),
            Arg("x_out", (seq * h,), Role.OUTPUT),
        ),
        launches=(
            Launch("o", kernel("gemm", seq, q, h), ("attn", "wo", "proj")),
            Launch("add1", kernel("add", seq, h), ("x", "proj", "res1")),
            Launch("rms", kernel("rmsnorm", seq, h, shapes.rms_eps), ("res1", "ffn_norm_w", "normed2")),
            Launch("gate", kernel("gemm", seq, h, f), ("normed2", "w_gate", "gate")),
            Launch("up", kernel("gemm", seq, h, f), ("normed2", "w_up", "up")),
            Launch("swiglu", kernel("swiglu", seq, f), ("gate", "up", "hidden_act")),
            Launch("down", kernel("gemm", seq, f, h), ("hidden_act", "w_down", "down")),
            Launch("add2", kernel("add", seq, h, flat_out=True), ("res1", "down", "x_out")),
        ),
    )
