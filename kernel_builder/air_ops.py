"""Op-level helpers of the one AIR reader (kernel_builder.air_module), which splits every block once with
`iter_block`: ops as `OpText`s (name, results, text, line), memref types, `air.channel` declarations, access
patterns and DMA operands - what the interpreter (multi_launch_builder.emulator.air_interp) and the hardware
model (kernel_builder.hw) read of one op. Built on kernel_builder.mlir_text (tokens, balanced brackets, op
spans). Nothing here executes or interprets an op.
"""
from __future__ import annotations

import bisect
import math
import re
from array import array
from dataclasses import dataclass
from typing import Iterator

from kernel_builder import mlir_text as mt

SSA = r"%[\w$.\-]+(?:#\d+)?"
RESULTS_RE = re.compile(rf"^\s*((?:{SSA})(?:\s*,\s*{SSA})*)\s*=\s*")
_RESULTS_AT = re.compile(RESULTS_RE.pattern[1:])   # the same, matched at a position inside the module text
_NAME_AT = re.compile(r"([A-Za-z_][\w$.]*)(?![\w$.\-])")       # a bare op name (`arith.addi`, `return`)

# bytes per element of the element types our builders use
ELEMENT_BYTES = {"bf16": 2, "f16": 2, "f32": 4, "f64": 8, "i8": 1, "i16": 2, "i32": 4, "i64": 8}


@dataclass(frozen=True)
class MemRefType:
    shape: tuple[int, ...]
    dtype: str
    space: int           # 0 = L3 (no memory space), 1 = L2 (memory tile), 2 = L1 (core tile)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def elem_bytes(self) -> int:
        try:
            return ELEMENT_BYTES[self.dtype]
        except KeyError:
            raise ValueError(f"unsupported element type {self.dtype!r}") from None

    @property
    def nbytes(self) -> int:
        return self.size * self.elem_bytes


def parse_memref_type(text: str) -> MemRefType:
    """`memref<8x64xbf16, 2 : i32>` -> MemRefType((8, 64), "bf16", 2)."""
    shape, dtype = mt.memref_shape(text)
    m = re.search(r",\s*(\d+)\s*(?::\s*i32)?\s*>\s*$", text)
    return MemRefType(shape, dtype, int(m.group(1)) if m else 0)


@dataclass
class OpText:
    """One op of a block: spans into the module text (no copy is kept: a region op spans most of the module,
    and the ops of every enclosing region are alive while its body is read)."""

    name: str
    results: list[str]
    src: str           # the whole module text
    start: int         # absolute offset of `full` in the module text
    end: int
    text_start: int    # absolute offset of `text` (after the results prefix)
    line: int

    @property
    def full(self) -> str:
        return self.src[self.start:self.end]

    @property
    def text(self) -> str:
        """The op without its results prefix."""
        return self.src[self.text_start:self.end]

    def where(self) -> str:
        return f"line {self.line}: `{self.full.splitlines()[0].strip()[:120]}`"


def top_groups(text: str) -> list[tuple[str, int, int]]:
    """Depth-0 bracket groups of an op text: (opener, start, end past the closer)."""
    out, pos = [], 0
    for t in mt.tokenize(text):
        if t.start < pos:
            continue
        if t.text in ("(", "[", "{", "<"):
            end = mt.match_bracket(text, t.start)
            out.append((t.text, t.start, end))
            pos = end
    return out


class ModuleCtx:
    """The module text; ops are spans into it so errors can name their line."""

    def __init__(self, text: str):
        self.text = text
        self._newlines = array("q", (m.start() for m in re.finditer("\n", text)))   # 8 bytes a line

    def line_of(self, pos: int) -> int:
        return bisect.bisect_left(self._newlines, pos) + 1


def iter_block(ctx: ModuleCtx, start: int, end: int) -> Iterator[OpText]:
    """The ops of the block text[start:end], each with its results, name and line, one at a time (memory
    stays proportional to one op, not to the block)."""
    text = ctx.text
    for s, e in mt.iter_ops(text, start, end):
        m = _RESULTS_AT.match(text, s, e)
        results, rest = ([], s) if m is None else ([r.strip() for r in m.group(1).split(",")], m.end())
        # the name is the first token after the results: a bare op name read in place, else (a quoted name, a
        # comment) from a short window, never a copy of the op
        n = _NAME_AT.match(text, rest, e)
        name = n.group(1) if n else mt.op_name(text[rest:min(e, rest + 512)])
        yield OpText(name, results, text, s, e, rest, ctx.line_of(s))


def channel_decls(others) -> dict[str, tuple[tuple[int, ...], tuple[int, ...]]]:
    """`air.channel @sym [sizes] {broadcast_shape = [...]}` -> {sym: (size, broadcast shape)}.
    ValueError for a size that does not broadcast to its shape or a channel declared twice."""
    out = {}
    for op in others:
        text = op if isinstance(op, str) else getattr(op, "text", str(op))
        m = re.match(r"\s*air\.channel\s+@([\w$.\-]+)\s*\[([\d,\s]*)\](.*)", text, re.DOTALL)
        if m is None:
            continue
        size = tuple(int(v) for v in m.group(2).split(",") if v.strip())
        b = re.search(r"broadcast_shape\s*=\s*\[([\d,\s]*)\]", m.group(3))
        bcast = tuple(int(v) for v in b.group(1).split(",") if v.strip()) if b else size
        if len(bcast) != len(size) or any(d != 1 and d != e for d, e in zip(size, bcast)):
            raise ValueError(f"air.channel @{m.group(1)}: size {list(size)} does not broadcast to {list(bcast)}")
        if m.group(1) in out:
            raise ValueError(f"air.channel @{m.group(1)} declared twice")
        out[m.group(1)] = (size, bcast)
    return out


def access_pattern(text: str) -> tuple[str, list[str], list[str], list[str]] | None:
    """`%buf[o0, o1] [s0, s1] [t0, t1]` -> (buffer, offsets, sizes, strides) as operand strings, or None."""
    m = re.fullmatch(rf"({SSA})\s*\[(.*?)\]\s*\[(.*?)\]\s*\[(.*?)\]", text.strip(), re.DOTALL)
    if m is None:
        return None
    parts = [[p.strip() for p in m.group(i).split(",") if p.strip()] for i in (2, 3, 4)]
    return m.group(1), parts[0], parts[1], parts[2]


def dma_sides(op: OpText) -> tuple[str, str] | None:
    """The two access-pattern texts (dst, src) of a synchronous `air.dma_memcpy_nd (dst..., src...)`."""
    body = op.text.strip()[len("air.dma_memcpy_nd"):].strip()
    if body.startswith("async") or body.startswith("["):
        return None
    groups = top_groups(body)
    if not groups or groups[0][0] != "(":
        return None
    sides = mt.split_top_level(body[groups[0][1] + 1:groups[0][2] - 1])
    return (sides[0], sides[1]) if len(sides) == 2 else None


CHANNEL_RE = re.compile(r"air\.channel\.(put|get)\s+@([\w$.\-]+)\s*\[(.*?)\]\s*\((.*)\)\s*:\s*\((.*)\)", re.DOTALL)
