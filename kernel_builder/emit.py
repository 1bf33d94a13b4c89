"""A tiny MLIR text emitter shared by the kernel builders.

Builders describe their module with `Block`s: a block collects op lines and nested regions; index/f32/i32
constants are hoisted to the top of the nearest *isolated* region (func, air.launch, air.segment,
air.herd), because those regions cannot see values defined outside them. SSA names are unique per module.
"""
from __future__ import annotations

from dataclasses import dataclass, field

L2 = 1  # memory space of memory-tile (L2) buffers
L1 = 2  # memory space of compute-tile (L1) buffers


def memref(shape, dtype: str = "bf16", space: int | None = None) -> str:
    dims = "x".join(str(int(d)) for d in shape)
    body = f"{dims}x{dtype}" if dims else dtype
    return f"memref<{body}>" if space is None else f"memref<{body}, {space} : i32>"


def f32_literal(x: float) -> str:
    return f"{float(x):.9e}"


def attr_dict(kind: str, params: dict) -> str:
    """The `llama_npu.kernel = {...}` entry: ints bare (i64), floats as `: f32`, bools as 0|1."""
    parts = [f'kind = "{kind}"']
    for key, value in params.items():
        if isinstance(value, bool):
            parts.append(f"{key} = {int(value)}")
        elif isinstance(value, int):
            parts.append(f"{key} = {value}")
        elif isinstance(value, float):
            parts.append(f"{key} = {f32_literal(value)} : f32")
        else:
            raise TypeError(f"unsupported kernel attribute {key}={value!r}")
    return "llama_npu.kernel = {" + ", ".join(parts) + "}"


class Names:
    def __init__(self) -> None:
        self._next: dict[str, int] = {}
        self._taken: set[str] = set()

    def fresh(self, hint: str) -> str:
        n = self._next.get(hint, 0)
        while True:
            name = f"%{hint}" if n == 0 else f"%{hint}_{n}"
            n += 1
            if name not in self._taken:
                break
        self._next[hint] = n
        self._taken.add(name)
        return name


@dataclass
class _Nested:
    header: str
    block: "Block"
    footer: str
    more: list = field(default_factory=list)  # (separator line, Block) for extra regions (scf.if else)


class Block:
    def __init__(self, names: Names, root: "Block | None" = None) -> None:
        self.names = names
        self.root = root or self
        self.items: list = []
        if root is None:
            self._consts: dict[tuple, str] = {}
            self._const_lines: list[str] = []

    # -- values -----------------------------------------------------------------------------------------
    def _const(self, value, ty: str, text: str, hint: str) -> str:
        root = self.root
        key = (ty, text)
        if key not in root._consts:
            name = self.names.fresh(hint)
            root._consts[key] = name
            root._const_lines.append(f"{name} = arith.constant {text} : {ty}")
        return root._consts[key]

    def idx(self, v) -> str:
        """An index value: SSA names pass through, ints become hoisted constants."""
        if isinstance(v, str):
            return v
        return self._const(v, "index", str(int(v)), f"c{int(v)}")

    def i32(self, v: int) -> str:
        return self._const(v, "i32", str(int(v)), f"c{int(v)}_i32")

    def f32(self, v: float) -> str:
        return self._const(v, "f32", f32_literal(v), "cst")

    def op(self, text: str) -> None:
        self.items.append(text)

    def value(self, hint: str, text: str) -> str:
        name = self.names.fresh(hint)
        self.items.append(f"{name} = {text}")
        return name

    def alloc(self, hint: str, ty: str) -> str:
        return self.value(hint, f"memref.alloc() : {ty}")

    def dealloc(self, name: str, ty: str) -> None:
        self.op(f"memref.dealloc {name} : {ty}")

    def muli(self, a, b) -> str:
        return self.value("t", f"arith.muli {self.idx(a)}, {self.idx(b)} : index")

    def addi(self, a, b) -> str:
        return self.value("t", f"arith.addi {self.idx(a)}, {self.idx(b)} : index")

    def nested(self, header: str, footer: str = "}", isolated: bool = False) -> "Block":
        child = Block(self.names, None if isolated else self.root)
        self.items.append(_Nested(header, child, footer))
        return child

    # -- common ops -------------------------------------------------------------------------------------
    def for_(self, lb, ub, step, hint: str = "i") -> tuple["Block", str]:
        iv = self.names.fresh(hint)
        body = self.nested(f"scf.for {iv} = {self.idx(lb)} to {self.idx(ub)} step {self.idx(step)} {{")
        return body, iv

    def dma(self, dst: str, dst_ty: str, dst_access, src: str, src_ty: str, src_access) -> None:
        """air.dma_memcpy_nd; an access is None (whole buffer) or (offsets, sizes, strides)."""
        self.op(f"air.dma_memcpy_nd ({self._access(dst, dst_access)}, {self._access(src, src_access)}) "
                f": ({dst_ty}, {src_ty})")

    def _access(self, buf: str, access) -> str:
        if access is None:
            return f"{buf}[] [] []"
        offsets, sizes, strides = access
        lists = [", ".join(self.idx(v) for v in part) for part in (offsets, sizes, strides)]
        return f"{buf}[{lists[0]}] [{lists[1]}] [{lists[2]}]"

    def channel_put(self, sym: str, indices, buf: str, ty: str, access) -> None:
        """Synchronous `air.channel.put @sym[indices] (buf[offsets] [sizes] [strides]) : (type)`."""
        self.op(f"air.channel.put @{sym}[{', '.join(self.idx(v) for v in indices)}] "
                f"({self._access(buf, access)}) : ({ty})")

    def channel_get(self, sym: str, indices, buf: str, ty: str, access) -> None:
        """Synchronous `air.channel.get @sym[indices] (buf[offsets] [sizes] [strides]) : (type)`."""
        self.op(f"air.channel.get @{sym}[{', '.join(self.idx(v) for v in indices)}] "
                f"({self._access(buf, access)}) : ({ty})")

    def pin_to_scope(self, buf: str, ty: str) -> None:
        """Keep an L1 buffer allocated in this block although all its other uses are inside a loop: one store of
        0 to its first element. mlir-air's air-fuse-alloc-dealloc moves an alloc whose every use lies in a loop
        into that loop, where the ping-pong transform doubles it (a buffer an external call writes, or carries
        from one iteration to the next, must stay single: with two alternating copies the call would read the
        other copy; mlir-air with the ping-pong candidate check would instead drop ping-pong for the whole loop)."""
        dtype = ty.split("x")[-1].split(",")[0].rstrip(">").strip()
        zero = self._const(0, dtype, "0", "zero") if dtype.startswith("i") else \
            self._const(0.0, dtype, "0.000000e+00", "zero")
        index = ", ".join(self.idx(0) for _ in ty.split("<", 1)[1].split("x")[:-1])
        self.op(f"memref.store {zero}, {buf}[{index}] : {ty}")

    def call(self, sym: str, operands: list[tuple[str, str]]) -> None:
        names = ", ".join(v for v, _ in operands)
        types = ", ".join(t for _, t in operands)
        self.op(f"func.call @{sym}({names}) : ({types}) -> ()")

    # -- rendering --------------------------------------------------------------------------------------
    def render(self, indent: int) -> list[str]:
        pad = "  " * indent
        out = [pad + line for line in (self._const_lines if self.root is self else [])]
        for item in self.items:
            if isinstance(item, _Nested):
                out.append(pad + item.header)
                out.extend(item.block.render(indent + 1))
                for sep, block in item.more:
                    out.append(pad + sep)
                    out.extend(block.render(indent + 1))
                out.append(pad + item.footer)
            else:
                out.append(pad + item)
        return out


@dataclass
class AirRegion:
    body: Block
    ids: list[str]
    args: list[str]


def _args_clause(names: Names, operands: list[tuple[str, str]], hint: str) -> tuple[str, list[str]]:
    if not operands:
        return "", []
    inner = [names.fresh(hint) for _ in operands]
    binds = ", ".join(f"{a}={v}" for a, (v, _) in zip(inner, operands))
    types = ", ".join(t for _, t in operands)
    return f" args({binds}) : {types}", inner


def _attrs_clause(attrs: list[str]) -> str:
    return f" attributes {{{', '.join(attrs)}}}" if attrs else ""


def tile_steps(b: Block, tile: str, per: int, step: int, steps: int, written=(), hint: str = "r") -> tuple[Block, str]:
    """The step loop of a bare herd's tile that owns `per` units (rows, elements) from `tile * per`, `steps` steps
    of `step` units: the loop block (`b` itself with one step, no loop) and the SSA index of the step's first unit.
    With more than one step the L1 buffers the call writes (`written`: (buffer, type) pairs, allocated in `b`)
    are pinned to `b` first: one copy each, outside the loop aircc ping-pongs (Block.pin_to_scope)."""
    if steps > 1:
        for buf, ty in written:
            b.pin_to_scope(buf, ty)
    first = b.muli(tile, per)
    if steps == 1:
        return b, first
    loop, i = b.for_(0, per, step, hint)
    return loop, loop.addi(first, i)


def elementwise_body(h: AirRegion, plan, symbol: str, l1_ty: str, names: tuple[str, str], in_ty: str,
                     out_ty: str) -> None:
    """The herd body of a two-input elementwise kernel over 1-D data (add, swiglu; `plan` a planner.RowPlan):
    tile t owns `plan.units_per_tile` contiguous elements and moves `plan.chunk_elements` per step, both inputs
    DMA'd L3 -> L1 (allocated in the loop, so aircc's ping-pong transform doubles them), one call of `symbol`
    into `y_l1` (allocated once: the call writes it), y stored. Offsets are affine in the tile id and the loop
    iv (no div/rem)."""
    b, n = h.body, plan.chunk_elements
    x0, x1, y = h.args
    yl = b.alloc("y_l1", l1_ty)   # written by the call
    loop, off = tile_steps(b, h.ids[0], plan.units_per_tile, n, plan.steps, [(yl, l1_ty)], "e")
    l0, l1 = loop.alloc(f"{names[0]}_l1", l1_ty), loop.alloc(f"{names[1]}_l1", l1_ty)
    loop.dma(l0, l1_ty, None, x0, in_ty, ([off], [n], [1]))
    loop.dma(l1, l1_ty, None, x1, in_ty, ([off], [n], [1]))
    loop.call(symbol, [(l0, l1_ty), (l1, l1_ty), (yl, l1_ty)])
    loop.dma(y, out_ty, ([off], [n], [1]), yl, l1_ty, None)
    loop.dealloc(l0, l1_ty)
    loop.dealloc(l1, l1_ty)
    b.dealloc(yl, l1_ty)


def launch(parent: Block, sizes: list[int], operands: list[tuple[str, str]], attrs: list[str]) -> AirRegion:
    names = parent.names
    ids = [names.fresh("lx") for _ in sizes]
    sz = [names.fresh("lsx") for _ in sizes]
    grid = ", ".join(f"{s}={parent.idx(v)}" for s, v in zip(sz, sizes))
    args, inner = _args_clause(names, operands, "la")
    header = f"air.launch ({', '.join(ids)}) in ({grid}){args}{_attrs_clause(attrs)} {{"
    return AirRegion(parent.nested(header, isolated=True), ids, inner)


def segment(parent: Block, sym: str, operands: list[tuple[str, str]], attrs: list[str] = ()) -> AirRegion:
    args, inner = _args_clause(parent.names, operands, "sa")
    header = f"air.segment @{sym}{args}{_attrs_clause(list(attrs))} {{"
    return AirRegion(parent.nested(header, isolated=True), [], inner)


def herd(parent: Block, sym: str, size: tuple[int, int], operands: list[tuple[str, str]],
         attrs: list[str] = ()) -> AirRegion:
    names = parent.names
    tx, ty, sx, sy = names.fresh("tx"), names.fresh("ty"), names.fresh("hsx"), names.fresh("hsy")
    args, inner = _args_clause(names, operands, "ha")
    header = (f"air.herd @{sym} tile ({tx}, {ty}) in ({sx}={parent.idx(size[0])}, {sy}={parent.idx(size[1])})"
              f"{args}{_attrs_clause(list(attrs))} {{")
    return AirRegion(parent.nested(header, isolated=True), [tx, ty], inner)


@dataclass
class Module:
    """One kernel module: private external declarations + one public func."""

    name: str
    arg_types: list[str]
    decls: list[str] = field(default_factory=list)
    channels: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.names = Names()
        self.args = [f"%arg{i}" for i in range(len(self.arg_types))]
        self.body = Block(self.names)

    def declare(self, symbol: str, obj: str, types: list[str]) -> None:
        decl = (f"func.func private @{symbol}({', '.join(types)}) "
                f'attributes {{link_with = "{obj}", llvm.emit_c_interface}}')
        if decl not in self.decls:
            self.decls.append(decl)

    def channel(self, symbol: str, size: list[int], broadcast_shape: list[int] | None = None) -> str:
        """Declare a module-level `air.channel @symbol [size] {broadcast_shape = [...]}`; returns the symbol.
        With a broadcast shape, one put at index i reaches every get whose index equals i on the
        non-broadcast dimensions (size 1 dims of `size` fan out to `broadcast_shape`)."""
        attrs = ""
        if broadcast_shape is not None and list(broadcast_shape) != list(size):
            attrs = f" {{broadcast_shape = [{', '.join(str(int(d)) for d in broadcast_shape)}]}}"
        self.channels.append(f"air.channel @{symbol} [{', '.join(str(int(d)) for d in size)}]{attrs}")
        return symbol

    def text(self) -> str:
        sig = ", ".join(f"{a}: {t}" for a, t in zip(self.args, self.arg_types))
        lines = ["module {"]
        lines += ["  " + c for c in self.channels]
        lines += ["  " + d for d in self.decls]
        lines.append(f"  func.func @{self.name}({sig}) {{")
        lines += self.body.render(2)
        lines.append("    return")
        lines.append("  }")
        lines.append("}")
        return "\n".join(lines) + "\n"


def gated_unit_module(kind: str, rows: int, dim: int, plan, ext) -> str:
    """The whole module of a gated unit y = act(gate) * up over `[rows, dim]` bf16 (swiglu, geglu): launch ->
    segment -> herd [plan.herd, 1] running `elementwise_body` with the kernel `ext` (its chunk = plan's)."""
    n = plan.chunk_elements
    ty = memref([rows, dim])
    l1_ty = memref([n], "bf16", L1)
    mod = Module(kind, [ty, ty, ty])
    mod.declare(ext.symbol, ext.obj, [l1_ty, l1_ty, l1_ty])
    types = [ty, ty, ty]
    la = launch(mod.body, [1, 1], list(zip(mod.args, types)), [attr_dict(kind, {"rows": rows, "dim": dim})])
    seg = segment(la.body, f"{kind}_seg", list(zip(la.args, types)))
    h = herd(seg.body, f"{kind}_herd", (plan.herd, 1), list(zip(seg.args, types)), [f'link_with = "{ext.obj}"'])
    elementwise_body(h, plan, ext.symbol, l1_ty, ("gate", "up"), ty, ty)
    return mod.text()
