"""Instruction counts of an external kernel call, declared in Python next to the kernel (each
`kernel_builder/<kind>/external.py` `COSTS` row's `work` returns `CallWork(counts=...)`): the same kinds the host
aie_api counts when it runs the kernel's AIE2P path (external_kernels/aie_api_host, docs/aie-api-host.md,
"Counts"), written as formulas in the kernel's loop bounds. The cost model (kernel_builder.hw.cost) turns them into
cycles; tests/test_kernel_counts.py runs every builder object on the host aie_api and checks the formula gives
exactly the host's counts, so an edit of a kernel's loops fails that test until its formula follows.

The helpers below are the host aie_api's counting rules, one per aie_api operation (a kernel's formula is a sum
of them times its loop trip counts):

    c = Counts()
    c += steps * (load(32, 2) * 2 + vmac(32) + store(32, 2))     # 32-lane bf16 loads, one mac, one store
"""
from __future__ import annotations

# The host aie_api's kinds, in its order (external_kernels/aie_api_host/aie_api/host/core.hpp; a test checks).
KINDS = ("mmul_bfp16_8x8x8", "mmul_bf16_4x8x8_emulated", "vmac_bf16", "vmul_f32_emulated", "vadd_acc",
         "vconvert", "bfp16_convert", "vload", "vstore", "vload_bytes", "vstore_bytes", "shuffle", "broadcast",
         "vmax", "reduce_add", "reduce_max", "exp2", "tanh", "inv", "invsqrt_scalar", "scalar_bf16_convert",
         "unpack")
# Kinds the kernels' descriptors may add besides the host's: external calls (call overhead).
EXTRA_KINDS = ("calls",)


class Counts(dict):
    """Counts by kind; + adds, * scales (by a trip count), missing kinds are 0."""

    def __init__(self, **kw):
        bad = set(kw) - _ALL
        if bad:
            raise ValueError(f"unknown instruction kind(s) {sorted(bad)}")
        super().__init__({k: v for k, v in kw.items() if v})

    @classmethod
    def _of(cls, d: dict) -> "Counts":   # no check: the kinds come from Counts already
        out = dict.__new__(cls)
        dict.update(out, d)
        return out

    def __add__(self, other: dict) -> "Counts":
        out = dict(self)
        for k, v in other.items():
            if v:
                out[k] = out.get(k, 0) + v
        return Counts._of(out)

    __radd__ = __add__

    def __mul__(self, n) -> "Counts":
        return Counts._of({k: v * n for k, v in self.items()} if n else {})

    __rmul__ = __mul__

    def host(self) -> dict:
        """Only the host aie_api's kinds (what AieHostLibrary.call returns, zeros dropped)."""
        return {k: v for k, v in self.items() if k in KINDS and v}


_ALL = frozenset(KINDS) | frozenset(EXTRA_KINDS)


def _per512(nbytes: int) -> int:
    return (nbytes + 63) // 64


def load(n: int, elem_bytes: int) -> Counts:
    """aie::load_v<n> of elem_bytes-byte elements: one instruction per 512 bits."""
    return Counts(vload=_per512(n * elem_bytes), vload_bytes=n * elem_bytes)


def load_unaligned(n: int, elem_bytes: int) -> Counts:
    """aie::load_unaligned_v<n>: two aligned loads and a shuffle."""
    return Counts(vload=2 * _per512(n * elem_bytes), vload_bytes=2 * n * elem_bytes, shuffle=1)


def store(n: int, elem_bytes: int) -> Counts:
    return Counts(vstore=_per512(n * elem_bytes), vstore_bytes=n * elem_bytes)


def vmac(n: int) -> Counts:
    """bf16 x bf16 aie::mul / mac / msc of n lanes."""
    return Counts(vmac_bf16=(n + 63) // 64)


def fmul(n: int) -> Counts:
    """f32 x f32 aie::mul / mac / msc of n lanes (emulated on AIE2P)."""
    return Counts(vmul_f32_emulated=(n + 15) // 16)


def conv(k: int = 1) -> Counts:
    """k accumulator <-> vector conversions (to_vector, from_vector, an accum built from a vector)."""
    return Counts(vconvert=k)


def add_acc(k: int = 1) -> Counts:
    return Counts(vadd_acc=k)


def exp2(n: int) -> Counts:
    return Counts(exp2=(n + 15) // 16)


def inv(n: int) -> Counts:
    return Counts(inv=(n + 31) // 32)


def scalar_bf16(k: int = 1) -> Counts:
    """k scalar float -> bfloat16 conversions (static_cast<bfloat16>)."""
    return Counts(scalar_bf16_convert=k)
