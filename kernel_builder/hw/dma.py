"""Access-pattern arithmetic shared by the analyzer's checks: canonical BD dimensions, linear offsets, the shim
BD folding of enclosing loops (air-opt-shim-dma-bds / airrt-to-npu), offsets over an iteration space."""
from __future__ import annotations

from kernel_builder.hw import count as cnt
from kernel_builder.hw import symbolic as sym
from kernel_builder.hw.facts import NPU2Facts
from kernel_builder.hw.ir import Access, Loop, Region

def canonical_dims(acc: Access) -> list[tuple[int, int]]:
    """(size, stride) pairs outermost first: size-1 dims dropped, contiguous neighbours merged."""
    dims = [(s, t) for s, t in zip(acc.sizes, acc.strides) if s != 1]
    out: list[tuple[int, int]] = []
    for s, t in reversed(dims):
        if out and out[0][1] * out[0][0] == t:  # outer stride = inner extent: one contiguous dim
            out[0] = (out[0][0] * s, out[0][1])
        else:
            out.insert(0, (s, t))
    return out or [(1, 1)]


def linear_offset(acc: Access) -> sym.Expr:
    out = sym.const(0)
    for o, t in zip(acc.offsets, acc.strides):
        out = sym.add(out, sym.mul(o, sym.const(t)))
    return out


def is_contiguous(acc: Access) -> bool:
    d = canonical_dims(acc)
    return len(d) == 1 and d[0][1] == 1


def _largest_factor(n: int, cap: int) -> int:
    for f in range(min(n, cap), 0, -1):
        if n % f == 0:
            return f
    return 1


def launch_window(launch: Region, tiling: tuple[int, ...]) -> int:
    """Launch iterations the runtime sequence issues between two waits: the whole grid without runtime loop
    tiling (every iteration's DMA tasks are configured before the sequence waits on them: each holds its BD
    IDs), one tile of the grid with it (air-opt-shim-dma-bds tiles the launch loop and syncs after each tile)."""
    n = 1
    for i, size in enumerate(launch.sizes):
        if tiling:
            n *= _largest_factor(size, tiling[i] if i < len(tiling) else 1)
        else:
            n *= size
    return n


def shim_fold(acc: Access, loops: tuple[Loop, ...], launch: Region, tiling: tuple[int, ...],
              facts: NPU2Facts, reads_ddr: bool = False) -> tuple[int, int, bool, int, int]:
    """(pieces per task, loop iterations folded into one task, non-affine, largest stride in elements, launch
    iterations folded into one task) for the DDR side of a transfer:
    enclosing loops are folded into the BD's wrap/stride dims innermost first while the offset is affine in
    the iv and at most 3 dims are in use (air-opt-shim-dma-bds); the launch grid folds only under runtime
    loop tiling (by the tile factors) and without it over the whole grid, for DDR reads only (seen in the real
    lowering, /work/tools/air-lower.sh on the GEMM: the A/W panel loads of a 1x16 launch became one 4-D BD
    each untiled, one per 2x2 tile with tiling 2,2, while the C row writes stayed one task per launch
    iteration either way, chained by their write-after-write dependencies on the output); dims beyond 4 and
    wraps beyond 1023 become extra BDs (airrt-to-npu)."""
    dims = canonical_dims(acc)
    off = linear_offset(acc)
    folded = 1
    non_affine = False
    stop = False
    for lp in reversed(loops):
        trip = cnt.static_trip(lp)
        if trip is not None and trip <= 1:
            continue
        affine = off.affine_in(lp.iv)
        if not affine:
            non_affine = True
        if stop or not affine or trip is None or sum(1 for s, _ in dims if s > 1) > 3:
            stop = True
            continue
        coef = off.coefficient(lp.iv) if off.is_affine else 0
        dims.insert(0, (trip, coef))
        folded *= trip
    launch_folded = 1
    if not tiling:
        tiling = tuple(launch.sizes)
    if reads_ddr and not stop:
        for i in reversed(range(len(launch.ids))):
            t = tiling[i] if i < len(tiling) else 1
            f = _largest_factor(launch.sizes[i], t)
            if f <= 1 or not off.affine_in(launch.ids[i]) or sum(1 for s, _ in dims if s > 1) > 3:
                break
            dims.insert(0, (f, off.coefficient(launch.ids[i]) if off.is_affine else 0))
            folded *= f
            launch_folded *= f
    # merge contiguous neighbours again, split wraps beyond the BD size field (unless linear)
    merged = Access(acc.buffer, [sym.const(0)] * len(dims), [s for s, _ in dims], [t for _, t in dims])
    dims = canonical_dims(merged)
    if not (len(dims) == 1 and dims[0][1] == 1):
        split = []
        for s, t in dims:
            if s > facts.shim_bd_max_size:
                f = _largest_factor(s, facts.shim_bd_max_size)
                split += [(s // f, t * f), (f, t)]
            else:
                split.append((s, t))
        dims = split
    pieces = 1
    for s, _ in dims[:max(0, len(dims) - facts.shim_bd_dims)]:
        pieces *= s
    return pieces, folded, non_affine, max((t for s, t in dims if s > 1), default=1), launch_folded


def iteration_space(e: sym.Expr, loops: tuple[Loop, ...]) -> sym.Expr:
    """`e` with each loop iv replaced by lb + step * k (k counting iterations), innermost first, so an offset's
    alignment is judged on the values the iv takes (kp = 0, 64, 128 ... is 128-byte aligned in bf16)."""
    for lp in reversed(loops):
        if lp.iv in e.variables:
            e = e.substitute({lp.iv: sym.add(lp.lb, sym.mul(lp.step, sym.var(lp.iv + "'")))})
    return e
