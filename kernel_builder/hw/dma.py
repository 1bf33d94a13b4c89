"""Access-pattern arithmetic shared by the analyzer's checks: canonical BD dimensions, linear offsets, the shim
BD folding of enclosing loops (air-opt-shim-dma-bds / airrt-to-npu), offsets over an iteration space."""
from __future__ import annotations

from typing import NamedTuple

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


def air_dims(dims: list[tuple[int, int]], max_size: int, volume: int = 1) -> list[tuple[int, int]]:
    """(size, stride) dims, outermost first, as mlir-air canonicalizes a channel access when it folds loops into it
    (Util.cpp canonicalizeWrapAndStrideList with maxSize = `max_size`, NPU2.air_dma_max_size, in elements of the
    memref's type): unless the whole access is one contiguous run (isDefaultDataAccessPattern: exempt, one dim),
    a dim larger than max_size is split into (outer, inner), inner its largest factor <= max_size (the two
    swapped when the outer stride would pass the 2^20 stride bound), and neighbours merge only while the merged
    size stays within max_size. So a 2304-byte run of rows of an i8 weight becomes 3 x 768: one dim more."""
    dims = [(s, t) for s, t in dims if s != 1]
    if not dims:
        return [(1, 1)]
    if _contiguous(dims):
        n = 1
        for s, _ in dims:
            n *= s
        return [(n, 1)]
    out: list[tuple[int, int]] = []
    for size, stride in dims:
        if size > max_size and (a := _largest_factor(size, max_size)) > 1:
            b = -(-size // a)
            inner, outer = (b, a) if (stride * a) % volume > (1 << 20) else (a, b)
            out += [(outer, (stride * inner) % volume if volume > 1 else stride * inner), (inner, stride)]
        else:
            out.append((size, stride))
    merged: list[tuple[int, int]] = []
    for s, t in reversed(out):
        if merged and merged[0][1] * merged[0][0] == t and s * merged[0][0] <= max_size:
            merged[0] = (merged[0][0] * s, merged[0][1])
        else:
            merged.insert(0, (s, t))
    return merged


def _contiguous(dims: list[tuple[int, int]]) -> bool:
    want = 1
    for s, t in reversed(dims):
        if t != want:
            return False
        want *= s
    return True


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


class ShimTask(NamedTuple):
    in_flight: int      # tasks in flight per wait
    folded: int         # loop iterations folded into one task
    non_affine: bool
    stride: int         # largest stride in elements
    ndims: int          # BD dimensions of the access itself (after air_dims)
    runs: int           # runs of one task (task_runs)
    split: int          # the parts airrt-to-npu splits each task into (wrap_split), 1 when it does not
    note: str = ""      # why loops stayed unfolded, when a run split by air_dims took their BD dim


def shim_fold(acc: Access, loops: tuple[Loop, ...], launch: Region, tiling: tuple[int, ...],
              facts: NPU2Facts, chained_write: bool = False, launch_level: bool = False) -> ShimTask:
    """How the DDR side of a transfer becomes shim DMA tasks (air-opt-shim-dma-bds, airrt-to-npu): a ShimTask.
    The access's own dims are taken as the pass canonicalizes them (air_dims: a non-contiguous run over
    NPU2.air_dma_max_size elements is split in two, one dim more).

    The enclosing loops, then the launch grid (innermost dim first), fold into the BD as extra wrap/stride
    dims while the offset is affine in the iv, the trip count is static and at most 3 dims are in use before
    the fold (AIRSpecializeChannelWrapAndStrideInScfFor); the first one that does not fold stops the folding.
    A loop of the herd or segment that does not fold becomes one task per iteration, each waited for; a loop
    of the launch body (`launch_level`: the A-resident GEMM's W stream) is unrolled with no wait in between, so
    all its iterations' tasks are in flight at once (docs/hardware-model.md: 64 per W channel in the tool). A
    launch dim that does not fold is unrolled with no wait in between, so its tasks stay in flight until the
    launch ends - or, under runtime loop tiling (--air-runtime-loop-tiling-sizes), until the end of one tile
    of the launch grid (the tile factor is the largest divisor of the extent not above the tiling size; a
    launch dim past the sizes given is not tiled: whole in every tile).
    A DDR write that shares its output with other writes of the launch (`chained_write`) folds no launch dim:
    AIR chains them by write-after-write dependencies and each stays one task per launch iteration (the GEMM's
    8 C row-panel writes through the real-lowering driver: one task per launch iteration, untiled and with
    tiling 2,2, while its A / W panel loads folded the grid; untiled, a 1 x 16 launch exhausted the shim BD
    IDs); a lone store folds like a load."""
    volume = acc.buffer.type.size
    dims = air_dims(list(zip(acc.sizes, acc.strides)), facts.air_dma_max_size, volume)
    split_runs = len(dims) > len(canonical_dims(acc))
    own_dims_list = list(dims)
    own_dims = len(dims)
    off = linear_offset(acc)
    folded = 1
    non_affine = False
    stop = False
    unfolded = 1   # iterations of the launch-body loops that did not fold
    note = ""

    def fold(var: str, trip: int | None, step: int) -> bool:
        nonlocal folded
        if trip is None or not off.affine_in(var) or sum(1 for s, _ in dims if s > 1) > 3:
            return False
        dims.insert(0, (trip, (off.coefficient(var) if off.is_affine else 0) * step))
        folded *= trip
        return True

    for lp in reversed(loops):
        trip = cnt.static_trip(lp)
        if trip is not None and trip <= 1:
            continue
        if not off.affine_in(lp.iv):
            non_affine = True
        step = lp.step.value
        if stop or step is None or not fold(lp.iv, trip, step):
            if not stop and split_runs and trip is not None and off.affine_in(lp.iv):
                runs = " x ".join(str(sz) for sz, _ in own_dims_list)
                note = (f"air-opt-shim-dma-bds splits its runs over NPU2.air_dma_max_size = {facts.air_dma_max_size} "
                        f"elements ({runs}: {own_dims} dims), so loop {lp.iv.split('#')[0]} finds no BD dim to "
                        f"fold into")
            stop = True
            unfolded *= trip or 1
    # a loop of the herd or segment that did not fold is waited for at every iteration: nothing accumulates; a
    # loop of the launch body is unrolled with no wait inside
    waits_inside = stop and not launch_level
    in_flight = unfolded if launch_level else 1
    for i in reversed(range(len(launch.ids))):
        extent = launch.sizes[i]
        if extent <= 1:
            continue
        # launch dims past the tiling sizes stay whole inside a tile (attention's 8 x 1 x 8 grid with tiling
        # 2,2 through the real-lowering driver: 2 x 8 = 16 chained output writes per shim column per wait)
        t = tiling[i] if i < len(tiling) else extent
        inner = _largest_factor(extent, t) if tiling else extent
        if stop or chained_write or not fold(launch.ids[i], inner, 1):
            stop = True
            if not waits_inside:
                in_flight *= inner
    dims = air_dims(dims, facts.air_dma_max_size, volume)
    split = wrap_split(dims, facts)
    if split > 1:
        # all parts issued before a wait (Phi-4-mini's decode query rows: 256 re-reads -> 8 tasks of 32 per
        # launch iteration)
        in_flight *= split
        dims[0] = (-(-dims[0][0] // split), dims[0][1])
    return ShimTask(in_flight, folded, non_affine, max((t for s, t in dims if s > 1), default=1), own_dims,
                    task_runs(dims), split, note)


def wrap_split(dims: list[tuple[int, int]], facts: NPU2Facts) -> int:
    """Into how many DMA tasks airrt-to-npu cuts one task of these folded (size, stride) dims, outermost first
    (mlir-air AIRRtToNpuPass.cpp tileIllegalWrapDim): the outermost of 4 BD dims must stay below 64, so it is
    tiled by its largest factor <= 63 and the dims past 4 unrolled into one task (one BD) per part. The pass
    runs after the waits were generated (one per original task, generateNpuWaitFromAIRRtWaitAll), and waits are
    paired with tasks in order per channel (generateAwaitsFromWaitAllOps): the extra parts are never freed."""
    if len(dims) < facts.shim_bd_dims or dims[0][0] < facts.bd_max_repeat:
        return 1
    return -(-dims[0][0] // _largest_factor(dims[0][0], facts.bd_max_repeat - 1))


def task_runs(dims: list[tuple[int, int]]) -> int:
    """How often one shim DMA task runs its BD (its repeat count + 1), from its folded (size, stride) dims,
    outermost first: airrt-to-npu (mlir-air AIRRtToNpuPass.cpp) makes the highest of the 4 BD dims the repeat
    count (size - 1) and folds every other dim of stride 0 (the same rows read again: a loop-invariant access
    folded out of its loop) into it by multiplying; aiex.npu.push_queue refuses a count past 255."""
    runs, rest = (dims[0][0], dims[1:]) if len(dims) >= 4 else (1, dims)
    for size, stride in rest:
        if stride == 0 and size > 1:
            runs *= size
    return runs


def iteration_space(e: sym.Expr, loops: tuple[Loop, ...]) -> sym.Expr:
    """`e` with each loop iv replaced by lb + step * k (k counting iterations), innermost first, so an offset's
    alignment is judged on the values the iv takes (kp = 0, 64, 128 ... is 128-byte aligned in bf16)."""
    for lp in reversed(loops):
        if lp.iv in e.variables:
            e = e.substitute({lp.iv: sym.add(lp.lb, sym.mul(lp.step, sym.var(lp.iv + "'")))})
    return e
