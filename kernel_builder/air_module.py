"""The one AIR reader: a module's text parsed once per process into a typed tree that every consumer reads.

`read(text)` returns the `AirModule` of a text: the module layout (aliases, private declarations, module-level
ops, funcs: kernel_builder.mlir_text), the public func, the `air.channel` declarations, the external kernels
(`link_with` objects), the aircc preset header, and the public func's body as a tree of `Op`s (each block split
once from the text: name, results, line, its region's ops, the header of an `air.launch` / `air.segment` /
`air.herd`). The hardware model (kernel_builder.hw.ir), the emulators (multi_launch_builder.emulator:
launch_program, air_interp), the build keys (multi_launch_builder.compile.keys), the aircc presets
(kernel_builder.hw.tune, kernel_builder.presets), the mlir-opt check (kernel_builder.mlir_check) and the
stitcher's kernel loading read this tree instead of splitting the text again; the tests' structure checks
(tests/air_*.py) take the declarations from it and their tokens from the same lexer.

Cached by the text itself (a dict keyed by the string: its hash is computed once per string object, a second
object with equal contents - the artifact read back from disk - finds the same tree), the newest `CACHE_SIZE`
texts kept. Every part is built on first use and kept (a refused text's error too): a build key only reads the
`link_with` objects, the interpreter the whole tree. `parses(text)` counts how often a text's layout was parsed
in this process (tests/test_air_reader.py: once). Ops hold spans into the text in compact arrays, never copies
of it (a region op spans most of its parent); an AIR op's header keeps only the header's text.
"""
from __future__ import annotations

import collections
import dataclasses
import functools
import hashlib
import re
import sys
import threading
from array import array

from kernel_builder import air_ops
from kernel_builder import mlir_text as mt

CACHE_SIZE = 512
PRESET_COMMENT = "// aircc preset:"    # the header line a stitched module records its aircc flags in
_CACHE: collections.OrderedDict[str, "AirModule"] = collections.OrderedDict()
_PARSES: collections.Counter[str] = collections.Counter()
_LOCK = threading.Lock()
_RESULTS_AT = re.compile(air_ops.RESULTS_RE.pattern[1:])
_BLOCK_LABEL = re.compile(r"\^bb\d*\(([^)]*)\)\s*:")


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def read(text: str) -> "AirModule":
    """The (cached) tree of a module text."""
    with _LOCK:   # a serving process loads modules from several threads
        hit = _CACHE.get(text)
        if hit is not None:
            _CACHE.move_to_end(text)
            return hit
        mod = _CACHE[text] = AirModule(text)
        while len(_CACHE) > CACHE_SIZE:
            _CACHE.popitem(last=False)
        return mod


def parses(text: str) -> int:
    """How many times this text's layout was parsed in this process."""
    return _PARSES[_digest(text)]


def clear() -> None:
    """Forget every cached tree and the parse counts (tests that count parses start from here)."""
    with _LOCK:
        _CACHE.clear()
        _PARSES.clear()


class Op:
    """One op of the tree, a view of entry `i` of its `Block` (which holds the spans: no copy of the text, a few
    words per op): name, results, line, its region's ops and AIR header, each read once when first asked."""

    __slots__ = ("_block", "_i")

    def __init__(self, block: "Block", i: int):
        self._block, self._i = block, i

    # the OpText interface (kernel_builder.air_ops)
    @property
    def name(self) -> str:
        return self._block.names[self._i]

    @property
    def src(self) -> str:
        return self._block.module.text

    @property
    def start(self) -> int:
        return self._block.starts[self._i]

    @property
    def end(self) -> int:
        return self._block.ends[self._i]

    @property
    def text_start(self) -> int:
        return self._block.text_starts[self._i]

    @property
    def results(self) -> list[str]:
        s, t = self.start, self.text_start
        if s == t:
            return []
        m = _RESULTS_AT.match(self.src, s, t)
        return [r.strip() for r in m.group(1).split(",")]

    @property
    def line(self) -> int:
        return self._block.module.line_of(self.start)

    @property
    def full(self) -> str:
        return self.src[self.start:self.end]

    @property
    def text(self) -> str:
        """The op without its results prefix."""
        return self.src[self.text_start:self.end]

    def where(self) -> str:
        return f"line {self.line}: `{self.full.splitlines()[0].strip()[:120]}`"

    # the region, read once (kept by the block)
    def _cached(self, what: str, make):
        memo = self._block.regions.setdefault(self._i, {})
        if what not in memo:
            memo[what] = make()
        return memo[what]

    @property
    def span(self) -> tuple[int, int] | None:
        """Span (inside the braces, relative to `full`) of the op's trailing region, or None."""
        return self._cached("span", lambda: _trailing_region(self.src, self.start, self.end))

    @property
    def air(self) -> mt.AirOp:
        """The header of an `air.launch` / `air.segment` / `air.herd` (spans relative to `full`; only the text
        up to the region is kept). ValueError for a malformed header."""
        def make():
            a = mt.parse_air_op(self.full)
            return a if a.region is None else dataclasses.replace(a, text=a.text[:a.region[0]])
        return self._cached("air", make)

    @property
    def block_label(self) -> re.Match | None:
        """The `^bb0(%a: t, ...):` header of a `linalg.generic` region (matched on the region text)."""
        def make():
            if self.span is None:
                return None
            return _BLOCK_LABEL.search(self.src, self.start + self.span[0], self.start + self.span[1])
        return self._cached("label", make)

    @property
    def body(self) -> "Block":
        """The ops of the op's region (after the block header of a `linalg.generic`); empty without a region.
        An AIR op's body is the inside of its region braces."""
        def make():
            if self.span is None:
                return Block(self._block.module, ())
            s, e = self.start + self.span[0], self.start + self.span[1]
            if self.name in mt.AIR_REGION_OPS:
                s, e = self.start + self.air.region[0] + 1, self.start + self.air.region[1] - 1
            elif self.name == "linalg.generic":
                if self.block_label is None:
                    return Block(self._block.module, ())
                s = self.block_label.end()
            return self._block.module.block(s, e)
        return self._cached("body", make)

    @property
    def head(self) -> str:
        """The op without results prefix and without its region (`scf.for %i = %a to %b step %c`)."""
        return self.text if self.span is None else self.src[self.text_start:self.start + self.span[0] - 1].strip()


def _trailing_region(src: str, start: int, end: int) -> tuple[int, int] | None:
    """The span (inside the braces, relative to `start`) of the trailing region of the op src[start:end], or None:
    the last depth-0 `{` group when the op ends with `}`, found without copying or tokenizing the region (each
    depth-0 bracket group is skipped with one bracket scan)."""
    if start == end or src[end - 1] != "}":
        return None
    cur = mt.lexer._Cursor(src, start, end, what="op")
    last = None
    while (t := cur.peek()) is not None:
        if t.text in ("(", "[", "{", "<"):
            s, e = cur.skip_group()
            if t.text == "{":
                last = (s, e)
        else:
            cur.next()
    return None if last is None else (last[0] + 1 - start, last[1] - 1 - start)


class Block:
    """The ops of one block: their spans in compact arrays, op names interned; `Op` views on iteration."""

    __slots__ = ("module", "names", "starts", "ends", "text_starts", "regions")

    def __init__(self, module: "AirModule", ops):
        self.module = module
        self.names: list[str] = []
        self.starts, self.ends, self.text_starts = array("q"), array("q"), array("q")
        self.regions: dict[int, dict] = {}
        for o in ops:
            self.names.append(sys.intern(o.name))
            self.starts.append(o.start)
            self.ends.append(o.end)
            self.text_starts.append(o.text_start)

    def __len__(self) -> int:
        return len(self.names)

    def __getitem__(self, i: int) -> Op:
        n = len(self.names)
        if not -n <= i < n:
            raise IndexError(i)
        return Op(self, i % n)

    def __iter__(self):
        return (Op(self, i) for i in range(len(self.names)))


def _once(fn):
    """cached_property that also keeps a ValueError: unreadable text is read (and refused) once too."""
    name = fn.__name__

    def get(self):
        memo = self.__dict__.setdefault("_memo", {})
        if name not in memo:
            try:
                memo[name] = (fn(self), None)
            except ValueError as e:
                memo[name] = (None, e)
        value, err = memo[name]
        if err is not None:
            raise type(err)(*err.args) from None   # a fresh exception: the kept one's traceback does not grow
        return value
    get.__doc__ = fn.__doc__
    return property(get)


class AirModule:
    """The typed tree of one module text; every attribute is parsed on first use and kept."""

    def __init__(self, text: str):
        self.text = text

    # -- layout -----------------------------------------------------------------------------------------------
    @_once
    def layout(self) -> mt.ModuleText:
        """Aliases, module-level ops, funcs (ValueError for text that is not one module)."""
        _PARSES[_digest(self.text)] += 1
        return mt.parse_module(self.text)

    @_once
    def func(self) -> mt.FuncOp:
        """The single public func.func with a body (ValueError otherwise)."""
        return self.layout.the_public_func()

    @_once
    def channels(self) -> dict[str, tuple[tuple[int, ...], tuple[int, ...]]]:
        """`air.channel` declarations: symbol -> (size, broadcast shape) (ValueError for a bad one)."""
        return air_ops.channel_decls(self.layout.others)

    @_once
    def externals(self) -> dict[str, str | None]:
        """Private declarations: symbol -> its `link_with` object (None without one)."""
        return {d.name: d.attributes.get("link_with") for d in self.layout.private_decls()}

    @_once
    def link_objects(self) -> tuple[str, ...]:
        """Every distinct `link_with` object of the module's declarations, sorted."""
        objs = set()
        for f in self.layout.funcs:
            obj = f.attributes.get("link_with")
            if isinstance(obj, str):
                objs.add(obj)
        return tuple(sorted(objs))

    @functools.cached_property
    def preset_flags(self) -> tuple[str, ...] | None:
        """The aircc flags a stitched module records in its header (`// aircc preset: <flags>` in the first four
        lines), None when it records none."""
        pos = 0
        for _ in range(4):
            end = self.text.find("\n", pos)
            line = self.text[pos:] if end < 0 else self.text[pos:end]
            if line.startswith(PRESET_COMMENT):
                return tuple(line[len(PRESET_COMMENT):].split())
            if end < 0:
                break
            pos = end + 1
        return None

    # -- the public func's ops ----------------------------------------------------------------------------------
    @functools.cached_property
    def _ctx(self) -> air_ops.ModuleCtx:
        return air_ops.ModuleCtx(self.text)

    def line_of(self, pos: int) -> int:
        return self._ctx.line_of(pos)

    @_once
    def body(self) -> Block:
        """The ops of the public func's body (its `return` included)."""
        func = self.func
        base = self.text.find(func.text)
        if base < 0:
            raise ValueError(f"func.func @{func.name}: cannot locate its text")
        return self.block(base + func.body[0], base + func.body[1])

    def block(self, start: int, end: int) -> Block:
        """The ops of text[start:end] (used by the tree itself: each block is split once)."""
        return Block(self, air_ops.iter_block(self._ctx, start, end))

    def walk(self):
        """Every op of the public func, depth first (an op, then its region's ops)."""
        def rec(ops):
            for op in ops:
                yield op
                if op.span is not None:
                    yield from rec(op.body)
        return rec(self.body)

    @_once
    def called_symbols(self) -> frozenset[str]:
        """The symbols of every `func.call` in the public func."""
        out = set()
        for op in self.walk():
            if op.name == "func.call":
                m = re.match(r"func\.call\s+@([\w$.]+)\(", op.text.strip())
                if m:
                    out.add(m.group(1))
        return frozenset(out)

    @_once
    def result_op_names(self) -> frozenset[str]:
        """The names of the ops with results in the public func (`%x = math.rsqrt ...` -> math.rsqrt)."""
        return frozenset(op.name for op in self.walk() if op.results)

    @_once
    def top_regions(self) -> tuple[Op, ...]:
        """The public func's `air.launch`es and bare `air.herd`s, in order."""
        return tuple(op for op in self.body if op.name in ("air.launch", "air.herd"))
