"""GEMM: c[m, n] = a[m, k] @ w[n, k]^T   (w in the Hugging Face [out, in] layout; bf16 in, f32 accumulate,
bf16 RNE out). The same weight buffer serves the decode GEMV, so no transposed copy exists. Epilogues (the tile's
last call, in place over its accumulator): "none"; "swiglu" (kind gemm_swiglu: c = silu(a.wg^T) * (a.wu^T), w the
[2n, k] interleave of the two weights by 8 rows (gemm_swiglu/layout.py), so a herd column's W panel is one L3 DMA
of the plain GEMM's shape; one launch instead of two GEMMs + a swiglu launch); "bias" (kind
gemm_bias: c = a.w^T + b, the bias slice of a herd column sent once down its W channel before the K slices).

MLIR + external C++ micro-kernel (kernel_builder.gemm.external.gemm_kernels: zero / mac / out on 8x8-blocked L1
tiles). Structure (plan from gemm_plan.plan_gemm; BM = herd_m*tile_m, BN = herd_n*tile_n, K2 = tile_k_l2):

  channels @gemm_a [herd_m, 1] and @gemm_b [1, herd_n] (broadcast to [herd_m, herd_n]), @gemm_c [herd_m, herd_n]
  air.launch over (m / BM, n / BN) output blocks
    air.segment @gemm_seg:
      scf.for kp over K in K2 steps:
        one L2 A panel per herd row i:     a_l2_i [tile_m, K2] <- a[m0 + i*tile_m, kp]      (L3 -> L2 DMA)
        one L2 W panel per herd column j:  w_l2_j [tile_n, K2] <- w[n0 + j*tile_n, kp]      (L3 -> L2 DMA; in
          w_parts row parts, one DMA each: two shim streams per panel; swiglu: rows 2*(n0 + j*tile_n/2))
        scf.for kb over the panel in tile_k steps: air.channel.put @gemm_a[i, 0] / @gemm_b[0, j] of the
          [*, tile_k] slice, re-blocked by the memory-tile DMA into 8x8 blocks [rows/8][tile_k/8][8][8]
      air.herd @gemm_herd [herd_m, herd_n] (no L3 operand): f32 accumulator in L1, zero(acc); scf.for over K
        in tile_k steps: get the A and W tiles (@gemm_a[tx, ty], @gemm_b[tx, ty]), mac(a, w, acc); then the
        epilogue writes the bf16 tile in place over the front of acc and air.channel.put @gemm_c[tx, ty] sends
        that front
      per herd row i: c_l2_i [tile_m, BN]; air.channel.get @gemm_c[i, j] for each herd column j, un-blocking
        the tile into columns [j*tile_n, +tile_n); then ONE DMA c_l2_i -> c[m0 + i*tile_m, n0]

W at rest in block float (w_format "bfp16", kinds gemm_bfp / gemm_bfp_bias: i8 [rows/8, 9k], 72-byte 8x8 blocks,
kernel_builder/block_float.py): the same structure with W in bytes, already blocked: each panel load or launch
stream is one run of 9 * tile_k_l2 bytes per 8-row block row into a plain [tile_n/8, 9 * tile_k_l2] L2 panel, and
each tile_k slice one run of 9C bytes per block row and K chunk of C columns (gemm/external.py bfp_chunk_k), the L1
tile order of external_kernels/gemm_bfp.cc. Nothing re-blocks W, nothing converts it in the core.

With A resident (plan.a_resident, `_resident`): one launch point per BM rows; the launch streams every W panel
on @gemm_w[j] (column block by column block, K step by K step); the segment keeps each herd row's whole A panel and
one C row panel per herd row, all pre-blocked in L2 (8x8 blocks, written so by the memory tile's S2MM), so every
slice, drain and C write is a pattern whose loops fold into one memory-tile BD; the W panels pass through one flat
ping-pong loop; the herd loops over the column blocks (docs/kernels.md "A resident in L2" says why each choice).

Every L2 buffer is its own allocation sized for one memory tile (the split air-split-l2-memref would make):
a memory tile serves at most one A panel, one W panel and one C row panel, i.e. <= 2 + herd_n S2MM and 3 MM2S
channels; the shim moves herd_m + herd_n panels in and herd_m C row panels out per launch point (<= 12 MM2S,
<= 8 S2MM on the 8x4 herd). The K loops of segment and herd hand the slices over in order: the i-th put on a
channel index pairs with the i-th get on each of its destinations (AIR channels are FIFOs). Layout changes
(8x8 re-blocking in, un-blocking out) happen in the memory-tile DMAs, whose innermost run is 8 contiguous bf16
(16 bytes); nothing transposes: each w 8x8 block is already the [n][k] operand the block-float mac_8x8_8x8T takes.
"""
from __future__ import annotations

from kernel_builder.emit import L1, L2, Module, attr_dict, herd, launch, memref, segment
import kernel_builder.gemm.a_bfp as a_bfp
from kernel_builder.gemm import c_bfp, plan as gemm_plan
from kernel_builder.gemm.external import BFP_COL_BYTES as BFP_ROW, bfp_chunk_k, c_epilogue, gemm_kernels, scratch_elems

KIND = "gemm"
BLOCK = 8   # edge of the micro-kernel's L1 blocks
KINDS = {"none": "gemm", "swiglu": "gemm_swiglu", "bias": "gemm_bias"}   # epilogue -> registered kernel kind
BFP_KINDS = {"none": "gemm_bfp", "swiglu": "gemm_bfp", "bias": "gemm_bfp_bias"}   # the "bfp16" W format's kinds


def build(m: int, k: int, n: int, epilogue: str = "none", w_format: str = "bf16", a_format: str = "bf16",
          c_format: str = "bf16") -> str:
    """The module of c[m, n]: arguments (a, w, c) (w: [2n, k] with the swiglu epilogue); (a, w, b, c)
    with the bias epilogue (b: [1, n]). w_format "bfp16" (kind gemm_bfp): w is the block-float encoding of that
    weight, i8 [rows/8, 9k] (kernel_builder/block_float.py), and the W panels and tiles move as whole 72-byte
    blocks (no re-blocking: a block row's slice is one contiguous run). a_format "bfp16" (with W in block float): a
    is i8 [m/8, 9k] at rest in block float too and moves likewise (kernel_builder/gemm/a_bfp.py). c_format "bfp16":
    c is written in block float, i8 [m/8, 9n] (the at-rest format of the weights; kernel_builder/gemm/c_bfp.py)."""
    p = gemm_plan.plan_gemm(m, k, n, epilogue, w_format=w_format, a_format=a_format, c_format=c_format)
    bfp = w_format == "bfp16"
    abfp = a_format == "bfp16"
    ext = gemm_kernels(p.tile_m, p.tile_k, p.tile_n, w_format, a_format, c_format)
    epi = c_epilogue(ext, epilogue, c_format)
    a_ty, w_ty, c_ty = memref([m, k]), memref([n, k]), memref([m, n])
    if epilogue == "swiglu":   # one [2n, k] weight: gate and up rows interleaved by 8 (gemm_swiglu/layout.py)
        w_ty = memref([2 * n, k])
    if bfp:
        w_ty = memref([p.w_per_out * n // BLOCK, BFP_ROW * k], "i8")
    if abfp:
        a_ty = a_bfp.l3_type(m, k)
    if c_format == "bfp16":   # block rows of 9n bytes (kernel_builder/block_float.py's layout)
        c_ty = memref([m // BLOCK, BFP_ROW * n], "i8")
    types = [a_ty, w_ty] + ([memref([1, n])] if epilogue == "bias" else []) + [c_ty]
    acc_ty = memref([2 * p.tile_m * p.tile_n], "bf16", L1)   # the f32 accumulator's bytes
    if c_format == "bfp16":   # typed i8 as the block-float C it sends (gemm/c_bfp.py)
        acc_ty = c_bfp.acc_type(p)
    a1_ty, w1_ty = memref([p.tile_m * p.tile_k], "bf16", L1), memref([p.tile_n * p.tile_k], "bf16", L1)
    if bfp:
        w1_ty = memref([p.w_bytes(p.tile_n, p.tile_k)], "i8", L1)
    b1_ty = memref([p.tile_n], "bf16", L1)
    s1_ty = memref([scratch_elems(p.tile_m, p.tile_k)], "bf16", L1)   # the mac's block-float copy of a
    if abfp:   # A at rest in block float: no scratch
        a1_ty, s1_ty = a_bfp.l1_type(p), None

    kind = (BFP_KINDS if bfp else KINDS)[epilogue]
    mod = Module(kind, types)
    mod.declare(ext.zero.symbol, ext.obj, [acc_ty])
    mod.declare(ext.mac.symbol, ext.obj, [a1_ty, w1_ty, acc_ty] + ([s1_ty] if s1_ty else []))
    mod.declare(epi.symbol, ext.obj, [acc_ty] + ([b1_ty] if epilogue == "bias" else []))
    grid = [p.herd_m, p.herd_n]
    ch_a = mod.channel("gemm_a", [p.herd_m, 1], grid)   # herd row i: one put, herd_n gets
    ch_b = mod.channel("gemm_b", [1, p.herd_n], grid)   # herd column j: one put per W part, herd_m gets
    ch_c = mod.channel("gemm_c", grid)                  # tile (i, j) -> its herd row's C panel
    la = launch(mod.body, [m // p.bm, 1 if p.a_resident else n // p.bn_out], list(zip(mod.args, types)),
                [attr_dict(kind, {"m": m, "k": k, "n": n,
                                  **({"glu": epilogue == "swiglu"} if kind == "gemm_bfp" else {}),
                                  **({"a_bfp": 1} if abfp else {}),
                                  **({"c_bfp": 1} if c_format == "bfp16" else {})})])
    ch_w = _stream_w(la.body, p, k, n, la.args[1], w_ty, mod) if p.a_resident else None
    seg = segment(la.body, "gemm_seg", list(zip(la.args, types)) + [(i, "index") for i in la.ids])
    s = seg.body
    a, *ws, c, bi, bj = seg.args
    bias = ws.pop() if epilogue == "bias" else None
    m0, n0 = s.muli(bi, p.bm), s.muli(bj, p.launch_n())
    c_row0 = s.muli(bi, p.bm // BLOCK) if c_format == "bfp16" else None   # C's first block row (block float)
    if p.a_resident:
        h = _resident(s, p, k, n, (a, a_ty, c, c_ty), m0, (ch_a, ch_b, ch_c, ch_w), ext,
                      a0=s.muli(bi, p.bm // BLOCK) if abfp else None, c_row0=c_row0)
        _herd_body(h, p, k, ext, epi, (acc_ty, a1_ty, w1_ty, b1_ty, s1_ty), ch_a, ch_b, ch_c, n // p.bn_out)
        return mod.text()
    if bias is not None:
        _stage_bias(s, p, n, bias, n0, ch_b)
    w0 = n0 if p.w_per_out == 1 else s.muli(bj, p.w_per_out * p.launch_n())   # the launch point's first W row
    if bfp:   # ... as an 8-row block row of the block-float weight
        w0 = s.muli(bj, p.w_per_out * p.launch_n() // BLOCK)
    a0 = s.muli(bi, p.bm // BLOCK) if abfp else m0   # block float: the launch point's first block row of a
    _stage_panels(s, p, k, n, a, a_ty, ws, w_ty, a0, w0, ch_a, ch_b)
    h = herd(s, "gemm_herd", (p.herd_m, p.herd_n), [], [f'link_with = "{ext.obj}"'])
    _herd_body(h, p, k, ext, epi, (acc_ty, a1_ty, w1_ty, b1_ty, s1_ty), ch_a, ch_b, ch_c)
    if c_format == "bfp16":
        c_bfp.drain(s, p, n, c, c_ty, c_row0, s.muli(bj, BFP_ROW * p.launch_n()), ch_c)
    else:
        _drain(s, p, n, c, c_ty, m0, n0, ch_c)
    return mod.text()


def _resident(s, p: gemm_plan.GemmPlan, k: int, n: int, args: tuple, m0: str, chans: tuple, ext, a0=None,
              c_row0=None):
    """A resident in L2 (plan.a_resident): one launch point per BM row block; per herd row its whole [tile_m, k]
    A panel is loaded once; a loop over the n / bn_out column blocks streams the W panels through L2 per K step,
    and a loop nest of its own re-sends the A slices from the resident panel; after the herd (which loops over the
    column blocks likewise) a second such loop drains each block's C row panels. Both panels are stored pre-blocked
    in L2 (`_preblocked`: the memory tile's S2MM writes the rows into 8x8 blocks), so a tile_k slice is two dims
    and the loops over the slices fold into one memory-tile BD (mlir-air air-opt-memtile-dma-bds folds a loop
    only into a pattern of at most three dims and unrolls the rest: with the 4-dim [rows/8][tile_k/8][8][8]
    slices every A and W slice of every column block became a BD of its own). `a0`: A in block float, the launch
    point's first block row of a (kernel_builder/gemm/a_bfp.py). Returns the herd."""
    a, a_ty, c, c_ty = args
    ch_a, ch_b, ch_c, ch_w = chans
    k2 = p.tile_k_l2
    a2_ty, w2_ty = memref([p.tile_m, k], "bf16", L2), _w_l2_type(p, k2)
    abfp = p.a_format == "bfp16"   # block float: the panel stored chunk-major, a slice is one contiguous run
    if abfp:
        a2_ty = a_bfp.resident_type(p, k)
    a2 = [s.alloc("a_l2", a2_ty) for _ in range(p.herd_m)]
    for i, buf in enumerate(a2):
        if abfp:
            a_bfp.resident_load(s, p, k, a, a_ty, buf, _plus(s, a0, i * p.tile_m // BLOCK))
            continue
        s.dma(buf, a2_ty, _preblocked(p.tile_m, k), a, a_ty,
              ([_plus(s, m0, i * p.tile_m), 0], [p.tile_m, k], [k, 1]))
    al, _ = s.for_(0, n, p.bn_out, "na")
    if abfp:
        a_bfp.resident_puts(al, p, k, a2, ch_a)
    else:
        sl, kb = al.for_(0, k // BLOCK, p.tile_k // BLOCK, "ka")
        for i, buf in enumerate(a2):
            sl.channel_put(ch_a, [i, 0], buf, a2_ty, _slice(p.tile_m, p.tile_k, k, kb))
    # the W panels of every (column block, K step) in one flat loop: a loop of its own around the K loop would be
    # unrolled by the tool (only the loop holding the panel allocations stays a ping-pong loop)
    kl, _ = s.for_(0, (n // p.bn_out) * (k // k2), 1, "wq")
    w2 = [kl.alloc("w_l2", w2_ty) for _ in range(p.herd_n)]
    bfp = p.w_format == "bfp16"   # block float: the panel arrives blocked, each slice is a run per block row
    for j, buf in enumerate(w2):
        kl.channel_get(ch_w, [j], buf, w2_ty, None if bfp else _preblocked(p.tile_n, k2))
    if bfp:   # the slice's first byte in each block row
        wl, wb = kl.for_(0, BFP_ROW * k2, BFP_ROW * p.tile_k, "kb")
    else:
        wl, wb = kl.for_(0, k2 // BLOCK, p.tile_k // BLOCK, "kb")
    for j, buf in enumerate(w2):
        wl.channel_put(ch_b, [0, j], buf, w2_ty,
                       _bfp_slice(p, k2, wb) if bfp else _slice(p.tile_n, p.tile_k, k2, wb))
    for buf in w2:
        kl.dealloc(buf, w2_ty)
    h = herd(s, "gemm_herd", (p.herd_m, p.herd_n), [], [f'link_with = "{ext.obj}"'])
    if p.c_format == "bfp16":
        c_bfp.resident_drain(s, p, n, c, c_ty, c_row0, ch_c)
    else:
        _resident_drain(s, p, n, c, c_ty, m0, ch_c)
    for buf in a2:
        s.dealloc(buf, a2_ty)
    return h


def _resident_drain(s, p: gemm_plan.GemmPlan, n: int, c: str, c_ty: str, m0: str, ch_c: str) -> None:
    """A resident, C in bf16: the herd row's tiles of each column block gathered and written to L3."""
    c2_ty = memref([p.tile_m, p.bn_out], "bf16", L2)
    # the C row panels: one copy each, kept out of the drain loop (pin_to_scope), pre-blocked: each drain is one
    # run per 8-row block and the panel leaves in 8-row pieces of three dims, so every drain and every write folds
    # the loop into one BD (a ping-pong pair, or a drain unrolled into a BD chain, gives the last drain of a
    # memory tile a seventh S2MM allocation: air-to-aie deals the channel index as the count of allocations
    # modulo 6, and the tile's first channel then carries two flows: aie-create-pathfinder-flows fails)
    c2 = [s.alloc("c_l2", c2_ty) for _ in range(p.herd_m)]
    for buf in c2:
        s.pin_to_scope(buf, c2_ty)
    dl, d0 = s.for_(0, n, p.bn_out, "nd")
    for i, buf in enumerate(c2):
        for j in range(p.herd_n):
            dl.channel_get(ch_c, [i, j], buf, c2_ty, _slice(p.tile_m, p.out_n, p.bn_out, j * p.out_n // BLOCK))
        rl, rb = dl.for_(0, p.tile_m // BLOCK, 1, "rb")
        row = rl.addi(rl.muli(rb, BLOCK), _plus(rl, m0, i * p.tile_m))
        rl.dma(c, c_ty, ([row, d0], [BLOCK, p.bn_out], [n, 1]), buf, c2_ty,
               ([rb, 0, 0, 0], [1, BLOCK, p.bn_out // BLOCK, BLOCK], [BLOCK * p.bn_out, BLOCK, BLOCK * BLOCK, 1]))
    for buf in c2:
        s.dealloc(buf, c2_ty)


def _stream_w(lb, p: gemm_plan.GemmPlan, k: int, n: int, w: str, w_ty: str, mod) -> str:
    """A resident: the launch body streams every W panel of the launch point, column block by column block and
    K step by K step, on channel @gemm_w[j] of herd column j (the segment's flat panel loop gets them in that
    order). The L3 side folds both loops into one shim BD. Returns the channel."""
    ch_w = mod.channel("gemm_w", [p.herd_n])
    if p.w_format == "bfp16":   # block rows of 9k bytes; a panel is a contiguous run of 9 * tile_k_l2 per block row
        nl, n0 = lb.for_(0, p.w_per_out * n // BLOCK, p.bn // BLOCK, "nw")
        kl, kp = nl.for_(0, BFP_ROW * k, BFP_ROW * p.tile_k_l2, "kw")
        for j in range(p.herd_n):
            kl.channel_put(ch_w, [j], w, w_ty, ([_plus(kl, n0, j * p.tile_n // BLOCK), kp],
                                                [p.tile_n // BLOCK, BFP_ROW * p.tile_k_l2], [BFP_ROW * k, 1]))
        return ch_w
    nl, n0 = lb.for_(0, p.w_per_out * n, p.bn, "nw")   # the W rows of one column block (swiglu: gate + up rows)
    kl, kp = nl.for_(0, k, p.tile_k_l2, "kw")
    for j in range(p.herd_n):
        kl.channel_put(ch_w, [j], w, w_ty, ([_plus(kl, n0, j * p.tile_n), kp], [p.tile_n, p.tile_k_l2], [k, 1]))
    return ch_w


def _w_l2_type(p: gemm_plan.GemmPlan, k2: int) -> str:
    """One L2 W panel of tile_k_l2 columns: bf16 [tile_n, k2], or block float i8 [tile_n/8, 9 * k2] (block rows)."""
    if p.w_format == "bfp16":
        return memref([p.tile_n // BLOCK, BFP_ROW * k2], "i8", L2)
    return memref([p.tile_n, k2], "bf16", L2)


def _bfp_slice(p: gemm_plan.GemmPlan, k2: int, byte0) -> tuple:
    """Read pattern of the tile_k slice starting at byte `byte0` of each block row of a block-float W panel (k2
    columns), in the L1 tile's order (gemm_bfp.cc): per K chunk of C = bfp_chunk_k(tile_k) columns, per block row
    one contiguous run of 9 C bytes (C/8 blocks of 72). The tools merge contiguous dims into one, and a memory-tile
    BD dim holds at most NPU2.bd_max_size elements: the chunks keep each run under it."""
    c = bfp_chunk_k(p.tile_k)
    rows = ([0, byte0], [p.tile_n // BLOCK, BFP_ROW * c], [BFP_ROW * k2, 1])
    if c == p.tile_k:
        return rows
    return ([0] + rows[0], [p.tile_k // c] + rows[1], [BFP_ROW * c] + rows[2])


def _preblocked(rows: int, cols: int) -> tuple:
    """Write pattern of a row-major [rows, cols] stream into an L2 buffer laid out as 8x8 blocks
    [rows/8][cols/8][8][8] (block (r, c) at (r*cols/8 + c)*64, each block row-major)."""
    return ([0, 0, 0, 0], [rows // BLOCK, BLOCK, cols // BLOCK, BLOCK], [BLOCK * cols, BLOCK, BLOCK * BLOCK, 1])


def _slice(rows: int, cols: int, row_len: int, col_block0) -> tuple:
    """Read pattern of the [rows, cols] slice starting at column block `col_block0` of a pre-blocked L2 buffer
    (`_preblocked` with `row_len` columns), in the micro-kernel's stream order [rows/8][cols/8][8][8]: per 8-row
    block one contiguous run of cols/8 blocks."""
    return ([0, col_block0, 0], [rows // BLOCK, cols // BLOCK, BLOCK * BLOCK], [BLOCK * row_len, BLOCK * BLOCK, 1])


def _blocked(rows: int, cols: int, row_len: int, col_block0) -> tuple:
    """Access pattern reading (or writing) [rows, cols] of a row-major buffer with `row_len` elements per row,
    starting at column block `col_block0` (in 8-element blocks), in the micro-kernel's 8x8-blocked stream
    order [rows/8][cols/8][8][8]."""
    return ([0, col_block0, 0, 0], [rows // BLOCK, cols // BLOCK, BLOCK, BLOCK],
            [BLOCK * row_len, BLOCK, row_len, 1])


def _plus(b, base: str, offset: int) -> str:
    return base if offset == 0 else b.addi(base, offset)


def _col0(p: gemm_plan.GemmPlan, j: int, n: int) -> int:
    """First output column of herd column j relative to the launch point's n0 (spread: its own quarter of n)."""
    return j * (n // p.herd_n if p.spread else p.out_n)


def _w_rows(p: gemm_plan.GemmPlan, j: int, part: int, n: int) -> int:
    """First row of W part `part` of herd column j relative to the launch point's first W row (the swiglu
    epilogue's interleaved weight has two rows per output column: gemm_swiglu/layout.py)."""
    return p.w_per_out * _col0(p, j, n) + part * p.part_rows


def _stage_bias(s, p: gemm_plan.GemmPlan, n: int, b: str, n0: str, ch_b: str) -> None:
    """Per herd column: its [tile_n] slice of the bias row L3 -> L2, put once down the W channel (before the K
    slices: channels are FIFOs)."""
    b_ty, b2_ty = memref([1, n]), memref([p.tile_n], "bf16", L2)
    for j in range(p.herd_n):
        b2 = s.alloc("b_l2", b2_ty)
        s.dma(b2, b2_ty, None, b, b_ty, ([0, _plus(s, n0, _col0(p, j, n))], [1, p.tile_n], [n, 1]))
        s.channel_put(ch_b, [0, j], b2, b2_ty, None)
        s.dealloc(b2, b2_ty)


def _stage_panels(s, p: gemm_plan.GemmPlan, k: int, n: int, a: str, a_ty: str, ws: list[str], w_ty: str, m0: str,
                  w0: str, ch_a: str, ch_b: str) -> None:
    """Per L2 K step: one A panel per herd row and one W panel per herd column L3 -> L2, a W panel in w_parts
    row parts (one DMA each, in plan.load_order), then one put per panel for each tile_k slice."""
    k2 = p.tile_k_l2
    bfp = p.w_format == "bfp16"   # block float: rows and columns of w in block rows and bytes (9 per column)
    a2_ty, w2_ty = memref([p.tile_m, k2], "bf16", L2), _w_l2_type(p, k2)
    abfp = p.a_format == "bfp16"   # A in block float: block rows and bytes, like W (kernel_builder/gemm/a_bfp.py)
    if abfp:
        a2_ty = a_bfp.panel_type(p, k2)
    kl, kp = s.for_(0, k, k2, "kp")
    a2 = [kl.alloc("a_l2", a2_ty) for _ in range(p.herd_m)]
    w2 = [kl.alloc("w_l2", w2_ty) for _ in range(p.herd_n)]
    kp_bytes = kl.muli(kp, BFP_ROW) if bfp else None   # the K step's first byte in each block row
    for kind, i, q in gemm_plan.load_order(p):
        if kind == "a" and abfp:
            a_bfp.load(kl, p, k, k2, a, a_ty, a2[i], _plus(kl, m0, i * p.tile_m // BLOCK), kp_bytes)
        elif kind == "a":
            kl.dma(a2[i], a2_ty, None, a, a_ty, ([_plus(kl, m0, i * p.tile_m), kp], [p.tile_m, k2], [k, 1]))
        elif bfp:   # W part q: block rows [q*part_rows/8, +part_rows/8) of herd column i's panel
            rows = p.part_rows // BLOCK
            row = _plus(kl, w0, _w_rows(p, i, q, n) // BLOCK)
            dst = None if p.w_parts == 1 else ([q * rows, 0], [rows, BFP_ROW * k2], [BFP_ROW * k2, 1])
            kl.dma(w2[i], w2_ty, dst, ws[0], w_ty, ([row, kp_bytes], [rows, BFP_ROW * k2], [BFP_ROW * k, 1]))
        else:   # W part q: rows [q*part_rows, +part_rows) of herd column i's panel
            row = _plus(kl, w0, _w_rows(p, i, q, n))
            dst = None if p.w_parts == 1 else ([q * p.part_rows, 0], [p.part_rows, k2], [k2, 1])
            kl.dma(w2[i], w2_ty, dst, ws[0], w_ty, ([row, kp], [p.part_rows, k2], [k, 1]))
    sl, kb = kl.for_(0, k2 // BLOCK, p.tile_k // BLOCK, "kb")
    wb = sl.muli(kb, BFP_ROW * BLOCK) if bfp and abfp else None   # (A in block float: needed first)
    for i, buf in enumerate(a2):
        sl.channel_put(ch_a, [i, 0], buf, a2_ty, a_bfp.slice_(p, k2, wb) if abfp
                       else _blocked(p.tile_m, p.tile_k, k2, kb))
    if bfp and not abfp:
        wb = sl.muli(kb, BFP_ROW * BLOCK)   # the slice's first byte in each block row
    for j, buf in enumerate(w2):
        sl.channel_put(ch_b, [0, j], buf, w2_ty, _bfp_slice(p, k2, wb) if bfp else _blocked(p.tile_n, p.tile_k, k2, kb))
    for buf in a2:
        kl.dealloc(buf, a2_ty)
    for buf in w2:
        kl.dealloc(buf, w2_ty)


def _herd_body(h, p: gemm_plan.GemmPlan, k: int, ext, epi, types: tuple, ch_a: str, ch_b: str, ch_c: str,
               blocks: int = 0) -> None:
    """One output tile per herd tile; with `blocks` (A resident) one per column block, in a loop (the accumulator
    and the block-float scratch allocated before it: one copy each)."""
    acc_ty, a1_ty, w1_ty, b1_ty, s1_ty = types
    tx, ty = h.ids
    acc = h.body.alloc("acc_l1", acc_ty)
    scratch = h.body.alloc("bfp_l1", s1_ty) if s1_ty else None   # none with A in block float
    if blocks:   # used only inside the loop: air-fuse-alloc-dealloc would move them in, to be ping-ponged
        h.body.pin_to_scope(acc, acc_ty)
        if scratch:
            h.body.pin_to_scope(scratch, s1_ty)
    body = h.body.for_(0, blocks, 1, "nb")[0] if blocks else h.body
    bias = None
    if epi is ext.bias:
        bias = body.alloc("b_l1", b1_ty)
        body.channel_get(ch_b, [tx, ty], bias, b1_ty, None)
    body.call(ext.zero.symbol, [(acc, acc_ty)])
    kl, _ = body.for_(0, k, p.tile_k, "k")
    a1, w1 = kl.alloc("a_l1", a1_ty), kl.alloc("w_l1", w1_ty)
    kl.channel_get(ch_a, [tx, ty], a1, a1_ty, None)
    kl.channel_get(ch_b, [tx, ty], w1, w1_ty, None)
    kl.call(ext.mac.symbol, [(a1, a1_ty), (w1, w1_ty), (acc, acc_ty)] + ([(scratch, s1_ty)] if scratch else []))
    kl.dealloc(a1, a1_ty)
    kl.dealloc(w1, w1_ty)
    body.call(epi.symbol, [(acc, acc_ty)] + ([(bias, b1_ty)] if bias else []))
    body.channel_put(ch_c, [tx, ty], acc, acc_ty,
                     c_bfp.put_pattern(p) if p.c_format == "bfp16" else ([0], [p.tile_m * p.out_n], [1]))
    h.body.dealloc(acc, acc_ty)
    if scratch:
        h.body.dealloc(scratch, s1_ty)
    if bias:
        body.dealloc(bias, b1_ty)


def _drain(s, p: gemm_plan.GemmPlan, n: int, c: str, c_ty: str, m0: str, n0: str, ch_c: str) -> None:
    """Per herd row: gather its herd_n tiles into one L2 row panel [tile_m, bn_out] (un-blocking each 8x8-blocked
    tile into its columns), then write the panel to L3 with one DMA (spread: its herd_n pieces n/herd_n apart)."""
    c2_ty = memref([p.tile_m, p.bn_out], "bf16", L2)
    for i in range(p.herd_m):
        c2 = s.alloc("c_l2", c2_ty)
        for j in range(p.herd_n):
            s.channel_get(ch_c, [i, j], c2, c2_ty, _blocked(p.tile_m, p.out_n, p.bn_out, j * p.out_n // BLOCK))
        row = _plus(s, m0, i * p.tile_m)
        dst = (([row, 0, n0], [p.tile_m, p.herd_n, p.out_n], [n, n // p.herd_n, 1]) if p.spread
               else ([row, n0], [p.tile_m, p.bn_out], [n, 1]))
        s.dma(c, c_ty, dst, c2, c2_ty, None)
        s.dealloc(c2, c2_ty)
