"""Values and run state of the AIR interpreter: memrefs (flat arrays, in place over the caller's bytes for
arguments), the operand readers every compiled op uses, what a run counts (`Stats`) and its live state (L1 bytes
of the current tile, the channel FIFOs)."""
from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from kernel_builder import air_ops
from kernel_builder.dtypes import DTYPES as _DTYPE_TABLE
from kernel_builder.air_module import Op
from kernel_builder.air_ops import MemRefType

F32 = np.float32
# memref element type -> numpy dtype, from the one dtype table (packed sub-byte types are not interpreted)
DTYPES = {d.mlir: d.host for d in _DTYPE_TABLE.values() if d.packed == 1}
L1_SPACE = 2


class InterpError(ValueError):
    pass


# ------------------------------------------------------------------------------------------------ values

class MemRef:
    """A memref value: a flat array of its element type (in place over the caller's bytes for arguments)."""

    __slots__ = ("data", "shape", "dtype", "space", "strides", "written", "name")

    def __init__(self, data: np.ndarray, shape: tuple[int, ...], dtype: str, space: int = 0, name: str = ""):
        self.data, self.shape, self.dtype, self.space, self.name = data, shape, dtype, space, name
        st, acc = [], 1
        for d in reversed(shape):
            st.append(acc)
            acc *= d
        self.strides = tuple(reversed(st))
        self.written = False

    @property
    def nbytes(self) -> int:
        return self.data.nbytes


def parse_memref_type(text: str) -> MemRefType:
    t = air_ops.parse_memref_type(text)
    if t.dtype not in DTYPES:
        raise ValueError(f"unsupported element type {t.dtype!r} in {text!r}")
    return t


# ------------------------------------------------------------------------------------------------ parsing
# The ops come from the one AIR reader's tree (kernel_builder.air_module), shared with the hardware model.

_SSA = air_ops.SSA
_top_groups = air_ops.top_groups


def _region_span(op: Op) -> tuple[int, int]:
    """Span (inside the braces, relative to op.full) of the op's trailing region."""
    span = op.span
    if span is None:
        raise InterpError(f"{op.where()}: expected a region")
    return span


# ------------------------------------------------------------------------------------------------ execution

Env = dict
Fn = Callable[[Env], None]

def _operand(tok: str) -> Callable[[Env], object]:
    tok = tok.strip()
    if tok.startswith("%"):
        def get(env, _n=tok):
            try:
                return env[_n]
            except KeyError:
                raise InterpError(f"value {_n} is not defined in this region") from None
        return get
    if re.fullmatch(r"-?\d+", tok):
        v = int(tok)
        return lambda env: v
    raise InterpError(f"unsupported operand {tok!r}")


def _operands(text: str) -> list[Callable[[Env], object]]:
    text = text.strip()
    return [] if not text else [_operand(t) for t in text.split(",")]

@dataclass
class Stats:
    """What one run did: DMA count/bytes, external calls, herd tiles, peak L1 bytes of one tile."""
    dmas: int = 0
    dma_bytes: int = 0
    calls: int = 0
    tiles: int = 0
    peak_l1_bytes: int = 0
    channel_puts: int = 0
    channel_gets: int = 0
    channel_put_bytes: int = 0   # bytes read by puts (a broadcast put counts once)
    calls_by_symbol: dict = field(default_factory=dict)


class _State:
    def __init__(self):
        self.stats = Stats()
        self.l1_live = 0
        self.fifos: dict[tuple, deque] = {}  # (channel, index tuple) -> deque of (data, dtype, source name)

    def pending_puts(self) -> list[str]:
        return [f"{sum(d.size for d, _, _ in q)} element(s) of {len(q)} put(s) on @{sym}{list(idx)}"
                for (sym, idx), q in self.fifos.items() if q]

    def on_alloc(self, m: MemRef):
        if m.space == L1_SPACE:
            self.l1_live += m.nbytes
            self.stats.peak_l1_bytes = max(self.stats.peak_l1_bytes, self.l1_live)

    def on_dealloc(self, m: MemRef):
        if m.space == L1_SPACE:
            self.l1_live -= m.nbytes
