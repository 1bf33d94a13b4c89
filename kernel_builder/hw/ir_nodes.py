"""The hardware model's tree of an AIR module: buffers, access patterns, loops, regions (launch / segment / herd),
allocations, transfers, external calls and compute ops, with every index value kept symbolic
(kernel_builder.hw.symbolic); `walk` visits a block depth first. kernel_builder.hw.ir builds it from the text."""
from __future__ import annotations

from dataclasses import dataclass, field

from kernel_builder.air_ops import MemRefType
from kernel_builder.hw.symbolic import Expr

L3, L2, L1 = 0, 1, 2


class HwParseError(ValueError):
    pass


@dataclass(eq=False)
class Buffer:
    name: str                 # SSA name at its definition (function argument or alloc result)
    type: MemRefType
    line: int                 # 0 for function arguments

    @property
    def space(self) -> int:
        return self.type.space

    @property
    def nbytes(self) -> int:
        return self.type.nbytes

    def __repr__(self) -> str:
        return f"Buffer({self.name}, {self.type.shape}, space {self.space})"


@dataclass
class Access:
    buffer: Buffer
    offsets: list[Expr]
    sizes: list[int]
    strides: list[int]

    @property
    def elements(self) -> int:
        n = 1
        for s in self.sizes:
            n *= s
        return n

    @property
    def nbytes(self) -> int:
        return self.elements * self.buffer.type.elem_bytes


@dataclass(eq=False)
class Node:
    line: int


@dataclass(eq=False)
class Block:
    nodes: list[Node] = field(default_factory=list)


@dataclass(eq=False)
class Loop(Node):
    iv: str
    lb: Expr
    ub: Expr
    step: Expr
    body: Block


@dataclass(eq=False)
class Region(Node):
    kind: str                 # "launch" | "segment" | "herd"
    symbol: str | None
    ids: list[str]            # variable names of the ids
    sizes: list[int]
    body: Block
    attributes: dict

    @property
    def n_instances(self) -> int:
        n = 1
        for s in self.sizes:
            n *= s
        return n


@dataclass(eq=False)
class Alloc(Node):
    buffer: Buffer


@dataclass(eq=False)
class Transfer(Node):
    kind: str                 # "dma" | "put" | "get"
    dst: Access | None        # dma: both sides; put: src only; get: dst only
    src: Access | None
    channel: str | None = None
    indices: list[Expr] = field(default_factory=list)


@dataclass(eq=False)
class Call(Node):
    symbol: str
    args: list                # Buffer | Expr | None per operand


@dataclass(eq=False)
class Compute(Node):
    kind: str                 # "matmul" | "generic" | "fill" | "scalar"
    macs: int                 # multiply-accumulates per execution (matmul), element ops otherwise
    reads: list[Buffer]
    writes: list[Buffer]
    divf: bool = False        # a scalar float division / rsqrt (soft-float call on the core)


@dataclass
class Module:
    name: str
    args: list[Buffer]
    launches: list[Region]
    channels: dict            # symbol -> (size, broadcast shape)
    externals: dict           # symbol -> link_with object (private declarations)
    ranges: dict = field(default_factory=dict)   # variable of a `llama_npu.range`d load -> (lo, hi), inclusive


def walk(block: Block):
    """Every node of a block, depth first (loops and regions included, then their bodies)."""
    for n in block.nodes:
        yield n
        if isinstance(n, (Loop, Region)):
            yield from walk(n.body)
