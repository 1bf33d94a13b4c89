"""Every size the kernels constrain, checked from config.json and the command line before any weight is read:
one line naming the constraint and the nearest valid value (llama_npu.errors), never a kernel traceback.

- model sizes (`check_model_sizes`): hidden_size, head_dim and intermediate_size must be multiples of the
  kernels' 32-lane bf16 vectors; the vocabulary has no constraint (the LM head's partitions are zero-padded);
- prefill buckets and the context (`check_run_sizes`): a bucket is a multiple of 16 (the attention kernel's
  16-key K/V tiles, the GEMMs' 8-row blocks) and at most the run's context; the context holds at least one
  bucket (16 positions);
- everything the arithmetic above cannot see (an L1 or DMA budget a huge size overflows) is found by planning
  the module declarations (`plan_modules`), which is cheap and reads no weight: one "not supported yet" line.
"""
from __future__ import annotations

import contextlib
from math import lcm
from typing import Sequence

from kernel_builder.add.external import ADD_N_MULTIPLE
from kernel_builder.attention.external import ATTN_HEAD_DIM_MULTIPLE, ATTN_LK_MULTIPLE, ATTN_LQ_MULTIPLE
from kernel_builder.gemm.external import GEMM_M_MULTIPLE, GEMM_N_MULTIPLE
from kernel_builder.gemv.external import GEMV_K_MULTIPLE
from kernel_builder.rmsnorm.external import RMSNORM_GROUP_MULTIPLE
from kernel_builder.rope.external import ROPE_HEAD_DIM_MULTIPLE
from kernel_builder.swiglu.external import SWIGLU_N_MULTIPLE

from .errors import ContextError, UnsupportedModel, UsageError

# prefill rows: GEMM row blocks, attention query tiles, and (a chunk is its own KV window) 16-key K/V tiles
BUCKET_MULTIPLE = lcm(GEMM_M_MULTIPLE, ATTN_LQ_MULTIPLE, ATTN_LK_MULTIPLE)
HIDDEN_MULTIPLE = lcm(GEMV_K_MULTIPLE, RMSNORM_GROUP_MULTIPLE, ADD_N_MULTIPLE)
HEAD_DIM_MULTIPLE = lcm(ATTN_HEAD_DIM_MULTIPLE, ROPE_HEAD_DIM_MULTIPLE)
FFN_MULTIPLE = lcm(SWIGLU_N_MULTIPLE, GEMV_K_MULTIPLE, GEMM_N_MULTIPLE)
MIN_CONTEXT = BUCKET_MULTIPLE
DEFAULT_BUCKETS = (64, 256, 1024, 2048)   # prefill lengths when none are given (filtered to the context)
DEFAULT_CONTEXT_CAP = 32768   # positions the KV cache is planned for when --context is not given


def nearest(value: int, multiple: int) -> list[int]:
    """The multiples of `multiple` next to `value` (below it when positive, above it), nearest first."""
    lo, hi = value // multiple * multiple, (value // multiple + 1) * multiple
    out = [v for v in (lo, hi) if v > 0]
    return sorted(out, key=lambda v: (abs(v - value), v))


def check_model_sizes(cfg) -> None:
    """UnsupportedModel (one line) for a config.json size the kernels cannot handle yet."""
    s = cfg.shapes
    path = cfg.model_dir / "config.json"
    for key, value, q, why in (
            ("hidden_size", s.hidden, HIDDEN_MULTIPLE, "the GEMV, RMSNorm and add kernels' 32-lane bf16 vectors"),
            ("head_dim", s.head_dim, HEAD_DIM_MULTIPLE, "the attention and RoPE kernels' 32-lane bf16 vectors"),
            ("intermediate_size", s.ffn, FFN_MULTIPLE, "the SwiGLU and GEMV kernels' 32-lane bf16 vectors")):
        if value % q:
            near = " or ".join(map(str, sorted(nearest(value, q))))
            raise UnsupportedModel(f"{path}: {key} {value} is not supported yet: the kernels need a multiple of {q} "
                                   f"({why}); the nearest supported {key} is {near}")
    if cfg.max_position < MIN_CONTEXT:
        raise UnsupportedModel(f"{path}: max_position_embeddings {cfg.max_position} is not supported: the kernels "
                               f"need a context of at least {MIN_CONTEXT} positions")


def check_run_sizes(cfg, buckets: Sequence[int] | None, context: int | None) -> tuple[int, ...]:
    """The prefill buckets of a run (the defaults when `buckets` is None), after checking the model's sizes,
    --context (UsageError/ContextError) and every bucket the user named (a multiple of BUCKET_MULTIPLE, at
    most the context: an oversized one is refused with the largest useful value)."""
    check_model_sizes(cfg)
    if context is not None:
        if context > cfg.max_position:
            raise ContextError(f"--context {context} exceeds the model's context of {cfg.max_position} positions")
        if context < MIN_CONTEXT:
            raise ContextError(f"--context {context} is too small: a run needs at least {MIN_CONTEXT} positions "
                               f"(one prefill bucket of {BUCKET_MULTIPLE} rows); nearest valid: {MIN_CONTEXT}")
    ctx = context or min(cfg.max_position, DEFAULT_CONTEXT_CAP)
    if buckets is None:
        return DEFAULT_BUCKETS
    what = ("this run's --context" if context else "the model's context" if ctx == cfg.max_position
            else "the default context cap")
    for b in buckets:
        if b % BUCKET_MULTIPLE:
            near = nearest(b, BUCKET_MULTIPLE)[0]
            raise UsageError(f"--buckets {b}: a prefill bucket must be a multiple of {BUCKET_MULTIPLE} (the "
                             f"attention kernel's {ATTN_LK_MULTIPLE}-key K/V tiles); nearest valid: {near}")
        if b > ctx:
            largest = ctx // BUCKET_MULTIPLE * BUCKET_MULTIPLE
            raise UsageError(f"--buckets {b} exceeds {what} of {ctx} positions; the largest useful bucket is {largest}")
    return tuple(buckets)


@contextlib.contextmanager
def kernel_sizes(cfg):
    """A kernel planner's ValueError (a size past an L1/DMA budget) inside the block as one UnsupportedModel line
    (planning the modules, or the memory plan that declares them)."""
    try:
        yield
    except ValueError as e:
        raise UnsupportedModel(f"{cfg.model_dir}: these model sizes are not supported by the kernels yet "
                               f"({str(e).splitlines()[0]})") from None


def plan_modules(model, cfg, buckets, context: int, decode_attention: str = "npu"):
    """model.modules(...) and the one-module greedy decode tokens (llama_npu/token_decode.py) under kernel_sizes: no
    weight is needed to plan every kernel."""
    from .token_decode import token_decls

    with kernel_sizes(cfg):
        return model.modules(buckets, context, decode_attention) + token_decls(
            model, model.kv_windows(context), decode_attention == "npu")


def context_tiles(model, context: int) -> bool:
    """Whether the kernels tile the decode attention of this context's largest KV window in every layer variant:
    the window only grows with the context, so a smaller context tiles whenever this one does (Gemma-3-1B's
    head_dim 256 at 32768 positions does not: more K/V tiles per split than one DMA task may repeat,
    kernel_builder/attention/plan.py). (The prefill attention's planner tiles any window: not asked here, its
    plan at a large window takes seconds.)"""
    from .models.llama import K_CACHE

    top = model.kv_windows(context)[-1]
    try:
        for v in model.layer_variants:
            for d in model.decode(top, v).decls:
                window = {a.name for a in d.args if getattr(a, "state_name", None) == K_CACHE}
                for la in d.launches:
                    if window & set(la.wiring):   # a kernel reading the KV window: its planner runs (cached)
                        la.build()
    except ValueError:
        return False
    return True
