"""The Llama family, described once: config -> shapes, the tensor map from Hugging Face names (both in
llama_npu.models.shapes, re-exported here), and the layer graph, from which every phase's module declarations are
derived (llama_npu.models.graph.lower).

A variant is a flag or a small subclass here: `QKNormLlama` (Qwen3-style per-head RMSNorm on q and k before
RoPE) adds two ops and two weights; nothing else in the code base changes for it.
"""
from __future__ import annotations

import functools
from dataclasses import replace

from multi_launch_builder.decl import Arg, ModuleDecl, Role
from kernel_builder.attention.external import ATTN_LK_MULTIPLE
from kernel_builder.gemv.plan import plan_gemv, plan_lm_head

from .fusion import fuse_epilogues
from .kv8 import kv8_graph
from .graph import (HEAD_PLAN, LayerGraph, Op, PhasePlan, State, Weight, decode_plan, lower, plan_decls,
                    prefill_plan)
from .lowering import BFP_SUFFIX, Q4_GROUP, Q4_SUFFIX, Q8_SUFFIX, RULES
from .shapes import (GATE_UP, GATE_UP_PAIR, GLOBAL_TENSORS, LAYER_TENSORS, LLAMA31_8B, LLAMA32_1B,  # noqa: F401
                     LLAMA32_3B, QK_NORM_TENSORS, QKV_BIAS_TENSORS, QWEN3_0P6B, QWEN3_1P7B, REFERENCE_SHAPES,
                     SMOLLM2_135M, ModelShapes, TensorSpec, gate_up_index, rotary_order)


def _plans(plan) -> bool:
    try:
        plan()
    except ValueError:
        return False
    return True


K_CACHE, V_CACHE, ROPE_TABLE = "k_cache", "v_cache", "rope"
VOCAB = "vocab"   # the LM head's rows (tied: the embedding), one state: its partitions are windows of it
LAYER_FAMILY = "layer"     # every per-layer module shares its bo_key's weights through this family
HEAD_FAMILY = "lm_head"


class LlamaModel:
    """Llama (RMSNorm, GQA, RoPE, SwiGLU, no biases), tied or untied embeddings."""

    qk_norm = False      # per-head RMSNorm on q and k before RoPE (Qwen3)
    qkv_bias = False     # q/k/v projections with a bias (Qwen2): a bias_add launch after each
    layer_variants: tuple[str, ...] = ("",)   # kinds of layer with their own modules (Gemma 3: sliding, global)
    shared_states: tuple[str, ...] = (ROPE_TABLE,)   # states one buffer serves every layer (not per bo_key)

    WEIGHTS = ("bf16", "q4", "bfp16")   # bfp16: linear layers at rest in block float (kernel_builder/block_float.py)
    KV = ("bf16", "int8")     # the KV cache's format (int8: models/kv8.py, docs/quantization.md "KV cache")

    def __init__(self, shapes: ModelShapes, weights: str = "bf16", sliding_window: int | None = None,
                 kv: str = "bf16"):
        if weights not in self.WEIGHTS:
            raise ValueError(f"weights must be one of {', '.join(self.WEIGHTS)}, got {weights!r}")
        if kv not in self.KV:
            raise ValueError(f"kv must be one of {', '.join(self.KV)}, got {kv!r}")
        self.shapes = shapes
        self.weights = weights
        self.kv = kv
        self.sliding_window = sliding_window   # a query sees its last sliding_window keys (None: all, causal)
        # the LM head's: bf16 / q8 when a q4 source keeps it so (ModelWeights); bf16 with block-float layers (a tied
        # head's rows are the embedding the one-dispatch token reads on the device, which has no block-float form)
        self.head_weights = "bf16" if weights == "bfp16" else weights
        self.q4_group = self.head_group = Q4_GROUP   # group sizes of the layers' / LM head's 4-bit weights
        self.tied = True              # the LM head is the embedding (ModelWeights says from the checkpoint)
        lm = plan_lm_head(shapes.vocab, shapes.hidden)
        self.lm_parts, self.lm_rows = lm.n_parts, lm.part_rows

    @classmethod
    def from_config(cls, cfg, weights: str = "bf16", kv: str = "bf16") -> "LlamaModel":
        """The description of a validated ModelConfig (its shapes; a family may read its `options`)."""
        w = cfg.sliding_window   # a window no shorter than the model's context masks nothing (Phi-4-mini: 262144)
        m = cls(cfg.shapes, weights, w if w and w < cfg.max_position else None, kv)
        m.tied = bool(cfg.tie_embeddings)
        return m

    # ------------------------------------------------------------------------------ tensor map
    def layer_tensors(self) -> dict[str, tuple[str, tuple[int, ...]]]:
        """Graph weight name -> (HF name under model.layers.{i}., shape as stored)."""
        s = self.shapes
        shapes = {"attn_norm": (s.hidden,), "wq": (s.q_dim, s.hidden), "wk": (s.kv_dim, s.hidden),
                  "wv": (s.kv_dim, s.hidden), "wo": (s.hidden, s.q_dim), "ffn_norm": (s.hidden,),
                  "w_gate": (s.ffn, s.hidden), "w_up": (s.ffn, s.hidden), "w_down": (s.hidden, s.ffn),
                  "q_norm": (s.head_dim,), "k_norm": (s.head_dim,), "bq": (s.q_dim,), "bk": (s.kv_dim,),
                  "bv": (s.kv_dim,)}
        names = dict(LAYER_TENSORS, **(QK_NORM_TENSORS if self.qk_norm else {}),
                     **(QKV_BIAS_TENSORS if self.qkv_bias else {}))
        return {w: (hf, shapes[w]) for w, hf in names.items()}

    def checkpoint_tensors(self) -> list[tuple[str, tuple[int, ...]]]:
        """The per-layer HF tensors (name under model.layers.{i}., shape as stored) the checkpoint must hold."""
        return list(dict.fromkeys(self.layer_tensors().values()))

    def _rotary_index(self, arg: str, rows: int) -> tuple[int, ...]:
        """The q/k rows in the partial-rotary order (rotary_order), () when RoPE rotates whole heads."""
        s = self.shapes
        if arg not in ("wq", "wk", "bq", "bk", "q_norm", "k_norm") or s.rot == s.head_dim:
            return ()
        order = rotary_order(s.head_dim, s.rot)
        return tuple(h * s.head_dim + j for h in range(rows // s.head_dim) for j in order)

    def static_tensor(self, arg: str, layer: int | None, lm_source: str = "lm_head") -> TensorSpec:
        """The tensor behind a static argument of a layer module (layer >= 0) or of the LM head."""
        if layer is None:
            if arg == "final_norm":
                return TensorSpec(GLOBAL_TENSORS["final_norm"], (self.shapes.hidden,))
            if arg.startswith("lm_"):
                p = int(arg[3:].removesuffix(Q4_SUFFIX).removesuffix(Q8_SUFFIX))
                name = GLOBAL_TENSORS["embed" if lm_source == "embed" else "lm_head"]
                return TensorSpec(name, (self.shapes.vocab, self.shapes.hidden), row0=p * self.lm_rows,
                                  rows=self.lm_rows)
            raise KeyError(f"no tensor for LM-head argument {arg!r}")
        base = arg.removesuffix(Q4_SUFFIX).removesuffix(BFP_SUFFIX)
        if base == GATE_UP:   # the gate and up rows interleaved by 8 (kernel_builder/gemm_swiglu/layout.py)
            (g, shape), (u, _) = self.layer_tensors()["w_gate"], self.layer_tensors()["w_up"]
            return TensorSpec(f"model.layers.{layer}.{g}", shape, index=gate_up_index(shape[0]),
                              parts=(f"model.layers.{layer}.{g}", f"model.layers.{layer}.{u}"))
        hf, shape = self.layer_tensors()[base]
        return TensorSpec(f"model.layers.{layer}.{hf}", shape, index=self._rotary_index(base, shape[0]))

    # ------------------------------------------------------------------------------ host-side hooks
    def variant_of(self, layer: int) -> str:
        """The layer variant (a `layer_variants` entry) layer `layer` runs."""
        return ""

    def window_of(self, variant: str = "") -> int | None:
        """The sliding window of keys of a layer variant's attention (None: full causal)."""
        return self.sliding_window

    def rope_tables(self, cfg) -> dict:
        """State name -> RopeParams of every RoPE table state (written once by the runtime)."""
        return {ROPE_TABLE: cfg.rope}

    def embed_rows(self, x):
        """The embedding rows (bf16 [rows, hidden], gathered on the host) as layer 0's input."""
        return x

    def final_logits(self, logits):
        """f32 logits [vocab] from the LM head, as the model returns them."""
        return logits

    # ------------------------------------------------------------------------------ the layer graph
    def layer_graph(self, variant: str = "") -> LayerGraph:
        return self.graph

    @functools.cached_property
    def graph(self) -> LayerGraph:
        s = self.shapes
        eps, hd = s.rms_eps, s.head_dim
        attn = {"heads": s.n_heads, "kv_heads": s.n_kv_heads, "head_dim": hd, "window": self.sliding_window}
        q, k = "q", "k"
        ops = [Op("rmsnorm", ("x", Weight("attn_norm")), "h", s.hidden, {"eps": eps})]
        for w, out, width, into in (("wq", "q", s.q_dim, ""), ("wk", "k", s.kv_dim, ""),
                                    ("wv", "v_new", s.kv_dim, V_CACHE)):
            if self.qkv_bias:    # the projection, then its bias row added (into the cache for v)
                ops += [Op("linear", ("h", Weight(w)), f"{out}_nb", width),
                        Op("bias_add", (f"{out}_nb", Weight(f"b{w[1]}")), out, width, into=into)]
            else:
                ops.append(Op("linear", ("h", Weight(w)), out, width, into=into))
        if self.qk_norm:
            ops += [Op("rmsnorm", ("q", Weight("q_norm")), "q_n", s.q_dim, {"eps": eps, "group": hd}),
                    Op("rmsnorm", ("k", Weight("k_norm")), "k_n", s.kv_dim, {"eps": eps, "group": hd})]
            q, k = "q_n", "k_n"
        ops += [
            Op("rope", (q, State(ROPE_TABLE)), "q_roped", s.q_dim),
            Op("rope", (k, State(ROPE_TABLE)), "k_new", s.kv_dim, into=K_CACHE),
            Op("attention", ("q_roped", State(K_CACHE), State(V_CACHE)), "attn", s.q_dim, attn),
            Op("linear", ("attn", Weight("wo")), "proj", s.hidden),
            Op("add", ("x", "proj"), "res1", s.hidden),
            Op("rmsnorm", ("res1", Weight("ffn_norm")), "h2", s.hidden, {"eps": eps}),
            *self._gate_up(s.ffn),
            Op("linear", ("act", Weight("w_down")), "down", s.hidden),
            Op("add", ("res1", "down"), "x_out", s.hidden),
        ]
        graph = LayerGraph("x", s.hidden, ("x_out",), ops,
                           {K_CACHE: s.kv_dim, V_CACHE: s.kv_dim, ROPE_TABLE: hd}, weights=self.weights,
                           q4_group=self.q4_group)
        return kv8_graph(graph, s) if self.kv == "int8" else graph

    def _gate_up(self, ffn: int) -> list[Op]:
        """The gate / up projections and SwiGLU. bf16 weights: ONE projection by the gate and up weights interleaved
        by 8 rows (GATE_UP, one device copy read by the decode GEMV and the prefill GEMM; kernel_builder/
        gemm_swiglu/layout.py), its output's (gate, up) pairs into SwiGLU (models/fusion.py fuses the two into
        the GEMM's epilogue in prefill). 4-bit weights, or a [2 ffn, hidden] GEMV that does not plan (Mistral-7B's
        28672 x 4096: more weight blocks per core than one DMA task repeats): the two projections."""
        if self.weights in ("bf16", "bfp16") and _plans(lambda: plan_gemv(2 * ffn, self.shapes.hidden)):
            return [Op("linear", ("h2", Weight(GATE_UP)), "gate_up", 2 * ffn),
                    Op("swiglu", ("gate_up",), "act", ffn, {"pairs": GATE_UP_PAIR})]
        return [Op("linear", ("h2", Weight("w_gate")), "gate", ffn),
                Op("linear", ("h2", Weight("w_up")), "up", ffn),
                Op("swiglu", ("gate", "up"), "act", ffn)]

    @functools.cached_property
    def head_graph(self) -> LayerGraph:
        """Final RMSNorm + the LM head as one GEMV per vocabulary partition (planner.plan_lm_head)."""
        s = self.shapes
        ops = [Op("rmsnorm", ("x", Weight("final_norm")), "x_norm", s.hidden, {"eps": s.rms_eps})]
        ops += [Op("linear", ("x_norm", Weight(f"lm_{p}")), f"logits_{p}", self.lm_rows) for p in range(self.lm_parts)]
        return LayerGraph("x", s.hidden, tuple(f"logits_{p}" for p in range(self.lm_parts)), ops, {},
                          weights=self.head_weights, q4_group=self.head_group)

    def phase_graph(self, rows: int, variant: str = "") -> LayerGraph:
        """The layer graph a phase of `rows` rows lowers: with more than one row (GEMMs) the GEMM epilogues of
        models/fusion.py DEFAULT fused (SwiGLU into the gate/up GEMM)."""
        graph = self.layer_graph(variant)
        return fuse_epilogues(graph) if rows > 1 else graph

    def _segments(self, *groups: tuple[str, str, str | None], variant: str = "",
                  graph: LayerGraph | None = None) -> list[tuple[str, str, list[str]]]:
        """Cut the op list after the named op outputs: (segment, module name, last op of the segment)."""
        outs = [op.out for op in (graph or self.layer_graph(variant)).ops]
        segs, start = [], 0
        for seg, name, last in groups:
            end = len(outs) if last is None else outs.index(last) + 1
            segs.append((seg, name, outs[start:end]))
            start = end
        return segs

    # ------------------------------------------------------------------------------ phases
    def prefill(self, rows: int, kv_rows: int | None = None, variant: str = "") -> PhasePlan:
        """A prefill chunk of `rows` tokens at any position whose K/V window (positions [0, kv_rows)) holds the
        chunk: attention inputs (+ K/V appended to the cache), attention, the rest (3 dispatches per layer).
        A layer variant's modules carry its name (`_<variant>`) where they differ from the plain layer's."""
        window = kv_rows or rows
        v = f"_{variant}" if variant else ""
        graph = self.phase_graph(rows, variant)
        span = self.slide_rows(rows, window, variant)
        kv = f"_slide{span}" if span else ("" if window == rows else f"_kv{window}")
        segs = self._segments(("qkv", f"qkv_s{rows}{v}", "k_new"), ("attn", f"attn_s{rows}{kv}{v}", "attn"),
                              ("ffn", f"ffn_s{rows}", None), graph=graph)
        phase = prefill_plan(rows, window)
        return lower(graph, replace(phase, kv_rows=span, slide=True) if span else phase, RULES, segs, LAYER_FAMILY)

    def decode(self, kv_rows: int | None = None, variant: str = "") -> PhasePlan:
        """One token. With `kv_rows`: the whole layer in ONE module (attention on the NPU over the cache window
        [0, kv_rows), or with a sliding window the `slide_rows` rows ending at the token), so a token is
        n_layers + 1 dispatches. Without: attention on the host between the
        attention-input and FFN modules (--decode-attention host)."""
        v = f"_{variant}" if variant else ""
        graph = self.layer_graph(variant)
        if kv_rows:
            span = self.slide_rows(1, kv_rows, variant)
            name = f"layer_slide{span}{v}" if span else f"layer_kv{kv_rows}{v}"
            segs = self._segments(("layer", name, None), variant=variant)
            phase = decode_plan(kv_rows)
            return lower(graph, replace(phase, kv_rows=span, slide=True) if span else phase, RULES, segs,
                         LAYER_FAMILY)
        segs = self._segments(("qkv", f"qkv_dec{v}", "k_new"), ("attn", f"attn_host{v}", "attn"),
                              ("ffn", "ffn_dec", None), variant=variant)
        return lower(graph, decode_plan(None), RULES, segs, LAYER_FAMILY, host_ops=frozenset({"attn"}))

    def slide_rows(self, rows: int, kv_rows: int, variant: str = "") -> int:
        """With a sliding window W: the KV rows a call of `rows` queries reads in place of the window [0, kv_rows)
        - the W + rows - 1 keys its queries see, in whole K/V tiles, ending at its last row (cache rows [KV0,
        KV0 + span), graph.call_scalars) - when no more than kv_rows; else 0 (the window from row 0)."""
        w = self.window_of(variant)
        if not w:
            return 0
        need = w + rows - 1
        span = -(-need // ATTN_LK_MULTIPLE) * ATTN_LK_MULTIPLE if rows == 1 and need <= self.WINDOW_ALIGN \
            else -(-need // self.WINDOW_ALIGN) * self.WINDOW_ALIGN
        return span if span <= kv_rows else 0

    def _per_layer(self, make):
        """One PhasePlan for every layer, or (layer variants) a tuple of each layer's."""
        by_variant = {v: make(v) for v in self.layer_variants}
        if len(by_variant) == 1:
            return next(iter(by_variant.values()))
        return tuple(by_variant[self.variant_of(layer)] for layer in range(self.shapes.n_layers))

    def head(self) -> PhasePlan:
        outs = [op.out for op in self.head_graph.ops]
        plan = lower(self.head_graph, HEAD_PLAN, RULES, [("lm_head", "lm_head", outs)], HEAD_FAMILY)
        # the partitions are windows of the one VOCAB state (the token module reads the embedding row from it)
        d = plan.steps[0].decl
        args = tuple(Arg(a.name, a.shape, Role.STATE, a.dtype, state=VOCAB,
                         at=int(a.name[3:].removesuffix(Q4_SUFFIX).removesuffix(Q8_SUFFIX)) * self.lm_rows)
                     if a.role is Role.STATIC and a.name.startswith("lm_") else a for a in d.args)
        return replace(plan, steps=(replace(plan.steps[0], decl=replace(d, args=args)),))

    WINDOW_ALIGN = 64   # attention streams K/V windows in tiles; every window is a multiple of this

    @classmethod
    def kv_windows(cls, context: int, smallest: int = 256) -> tuple[int, ...]:
        """The KV-cache windows attention modules are built for: powers of two from `smallest`, and the context
        rounded up to WINDOW_ALIGN (the cache's capacity is always one of these; positions past the context are
        never used)."""
        top = -(-context // cls.WINDOW_ALIGN) * cls.WINDOW_ALIGN
        out, w = [], smallest
        while w < top:
            out.append(w)
            w *= 2
        return tuple(out) + (top,)

    def plans(self, buckets, context: int | None = None, decode_attention: str = "npu") -> dict:
        """Every phase plan a run with these prefill buckets and this context needs:
        prefill_plan(rows, window) for every bucket and every window that can hold a chunk of it,
        decode_plan(window) per window (NPU attention) or decode_plan(None) (host attention), HEAD_PLAN
        (graph.py: each key is its plan's Phase).
        The context defaults to the largest bucket."""
        context = context or max(int(b) for b in buckets)
        windows = self.kv_windows(context)
        out = {}
        for r in sorted(set(int(b) for b in buckets)):
            for w in sorted({r, *[w for w in windows if w > r]}):
                out[prefill_plan(r, w)] = self._per_layer(lambda v, r=r, w=w: self.prefill(r, w, v))
        if decode_attention == "host":
            out[decode_plan(None)] = self._per_layer(lambda v: self.decode(None, v))
        else:
            for w in windows:
                out[decode_plan(w)] = self._per_layer(lambda v, w=w: self.decode(w, v))
        out[HEAD_PLAN] = self.head()
        return out

    def modules(self, buckets, context: int | None = None, decode_attention: str = "npu") -> list[ModuleDecl]:
        """Every module declaration of those plans (de-duplicated: qkv/ffn serve every window)."""
        seen: dict[str, ModuleDecl] = {}
        for plan in self.plans(buckets, context, decode_attention).values():
            for d in plan_decls(plan):
                seen.setdefault(d.name, d)
        return list(seen.values())


class QKNormLlama(LlamaModel):
    """Qwen3-style attention: RMSNorm over each head of q and k (weights [head_dim]) before RoPE."""

    qk_norm = True


def _families():
    from .family import Family
    return (Family("LlamaForCausalLM", "llama", LlamaModel, "the reference layer"),
            Family("Qwen3ForCausalLM", "qwen3", QKNormLlama,
                   "per-head RMSNorm on q and k before RoPE: two rmsnorm ops (group = head_dim)"))


LLAMA_FAMILY, QWEN3_FAMILY = _families()
