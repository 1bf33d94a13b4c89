"""Every multi-launch module a model needs: per prefill bucket, and for decode (LM head shared)."""
from __future__ import annotations

from typing import Iterable

from multi_launch_builder.decl import ModuleDecl
from multi_launch_builder.flash_attn import flash_attn
from multi_launch_builder.lm_head_gemv import lm_head_gemv
from multi_launch_builder.o_ffn import o_ffn
from multi_launch_builder.o_gemv_ffn import o_gemv_ffn
from multi_launch_builder.rms_gemms_rope import rms_gemms_rope
from multi_launch_builder.rms_gemv_rope import rms_gemv_rope
from multi_launch_builder.shapes import ModelShapes


def prefill_modules(shapes: ModelShapes, seq: int) -> list[ModuleDecl]:
    """The three per-layer prefill modules for one prompt bucket, in execution order."""
    return [rms_gemms_rope(shapes, seq), flash_attn(shapes, seq), o_ffn(shapes, seq)]


def decode_modules(shapes: ModelShapes) -> list[ModuleDecl]:
    """The two per-layer decode modules and the LM head (also used after prefill)."""
    return [rms_gemv_rope(shapes), o_gemv_ffn(shapes), lm_head_gemv(shapes)]


def all_modules(shapes: ModelShapes, buckets: Iterable[int]) -> list[ModuleDecl]:
    """Prefill modules of every bucket (ascending, de-duplicated) followed by the decode modules."""
    out: list[ModuleDecl] = []
    for seq in sorted(set(int(b) for b in buckets)):
        out += prefill_modules(shapes, seq)
    return out + decode_modules(shapes)
