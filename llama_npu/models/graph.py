"""A layer graph, written once per model family, and its lowering to multi-launch module declarations.

A model description (llama_npu.models.llama) lists the ops of ONE decoder layer on typed operands: activations
(the layer input and op outputs, by tensor name), weights (`Weight(name)`) and persistent states (`State(name)`:
the KV cache, the RoPE table). A *phase* (prefill of `rows` tokens, or decode of one token against a KV window of
`kv_rows` positions; its `Stage`) cuts that list into segments; `lower()` turns each segment into a `ModuleDecl` and records where each of
its inputs comes from, so the engine walks every phase with one loop:

  - roles follow from the cut: a tensor produced and consumed inside a segment is INTERMEDIATE, one that
    another step (or the next layer) needs is OUTPUT, one produced elsewhere is INPUT (bound on the device
    with ModuleExecutor.ref), weights are STATIC, state windows are STATE, the position is a scalar;
  - each op picks its kernel for the phase through a lowering rule (a linear layer is a GEMV for one row,
    a GEMM otherwise);
  - a segment made of a host op (decode attention on the CPU, the fallback) becomes a host step.

Nothing here is specific to Llama: which ops, weights and tensor names a family has lives in its
description.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field, replace
from typing import Callable, Union

from multi_launch_builder.decl import Arg, Launch, ModuleDecl, Role
from kernel_builder import block_float
from kernel_builder.presets import AirccPreset

POS = "pos"   # the scalar holding the first row (position) a call works on
# A sliding-window attention call reads only the cache rows its queries can see: its K/V window starts at the
# row held by KV0 (max(0, pos + rows - window rows)) and its queries sit at KV_POS = pos - KV0 within it
KV0, KV_POS = "kv0", "kv_pos"


@dataclass(frozen=True)
class Weight:
    """An op operand that is a static weight of the layer: `name` is its key in the family's tensor map."""

    name: str


@dataclass(frozen=True)
class State:
    """An op operand that is a persistent state (a `LayerGraph.states` entry: the KV cache, a RoPE table)."""

    name: str


# An op operand: an activation (the layer input or an op's output, by tensor name), a Weight or a State.
Operand = Union[str, Weight, State]
_LEGACY = {"w:": Weight, "s:": State}   # the old string spelling, accepted in declarations only (Op.__post_init__)


def is_activation(t: Operand) -> bool:
    return isinstance(t, str)


@dataclass(frozen=True)
class Op:
    """`out = kind(*ins)`. `ins` are activations (tensor names), Weight or State operands. With `into`, the
    output is written into that state's window at the call's position instead of an activation (a KV-cache
    append)."""

    kind: str
    ins: tuple[Operand, ...]
    out: str
    width: int                     # columns of the output ([rows, width])
    params: dict = field(default_factory=dict, compare=False)
    into: str = ""

    def __post_init__(self) -> None:
        # compatibility: a declaration may still spell an operand "w:<weight>" / "s:<state>"; it is typed here,
        # once, so nothing downstream reads a prefix
        ins = tuple(_LEGACY[t[:2]](t[2:]) if isinstance(t, str) and t[:2] in _LEGACY else t for t in self.ins)
        object.__setattr__(self, "ins", ins)


class Stage(str, enum.Enum):
    """What a phase computes: a prefill chunk, one decode token, or the LM head."""

    PREFILL = "prefill"
    DECODE = "decode"
    HEAD = "head"


@dataclass(frozen=True)
class Phase:
    """`rows` tokens per call at the call's position `pos` (a scalar); an attention op reads the KV-cache
    window of positions [0, kv_rows) (0: no device attention). A Phase also keys its plan in
    LlamaModel.plans() (prefill_plan, decode_plan, HEAD_PLAN)."""

    stage: Stage
    rows: int
    kv_rows: int
    slide: bool = False            # the KV window is cache rows [KV0, KV0 + kv_rows), not [0, kv_rows)

    def __post_init__(self) -> None:
        object.__setattr__(self, "stage", Stage(self.stage))   # Stage("prefill") is Stage.PREFILL

    @property
    def name(self) -> str:
        return self.stage.value


def call_scalars(decl: ModuleDecl, pos: int) -> dict[str, int]:
    """The scalars of a call of `decl` at position `pos`: POS, and for a sliding KV window its first cache row
    KV0 (the window ends with the call's last row, or starts at 0) and the position within it, KV_POS."""
    out = {POS: pos} if POS in decl.scalars else {}
    if KV0 in decl.scalars:
        window = next(a.shape[0] for a in decl.args if a.at == KV0)
        rows = next(a.shape[0] for a in decl.args if a.role in (Role.INPUT, Role.OUTPUT, Role.INTERMEDIATE))
        out[KV0] = max(0, pos + rows - window)
        out[KV_POS] = pos - out[KV0]
    return out


@dataclass(frozen=True)
class Source:
    """Where a step's INPUT comes from: the layer input (step -1), or argument `arg` of step `step` (a module's
    output, or the buffer an earlier module took the same tensor in), or a host step's result."""

    tensor: str
    step: int = -1
    arg: str = ""
    host: bool = False


@dataclass(frozen=True)
class Step:
    """One dispatch of a layer (`decl`), or one host op (`host_op`, decl None)."""

    decl: ModuleDecl | None
    inputs: dict                   # INPUT arg name (= tensor) -> Source
    host_op: Op | None = None


@dataclass(frozen=True)
class PhasePlan:
    phase: Phase
    steps: tuple[Step, ...]
    output: tuple[int, str]        # (step, arg) holding the layer output (the next layer's input)

    @property
    def decls(self) -> list[ModuleDecl]:
        return [s.decl for s in self.steps if s.decl is not None]


# The keys of LlamaModel.plans(): each plan's own Phase, spelled once for the model description and the runtime.
HEAD_PLAN = Phase(Stage.HEAD, 1, 0)


def prefill_plan(rows: int, window: int) -> Phase:
    """The key (and phase) of the prefill plan of `rows` rows attending over a KV window of `window` rows."""
    return Phase(Stage.PREFILL, rows, window)


def decode_plan(window: int | None) -> Phase:
    """The key (and phase) of the decode plan over a KV window of `window` rows (None: the CPU decode
    attention, kv_rows 0)."""
    return Phase(Stage.DECODE, 1, window or 0)


# A phase's plan for the whole model: one PhasePlan every layer runs, or (a family with layer variants: Gemma 3's
# sliding and global layers) a tuple of one PhasePlan per layer.
def layer_plan(plan, layer: int) -> PhasePlan:
    """The PhasePlan layer `layer` runs (a negative layer counts from the end, as in a tuple)."""
    return plan[layer] if isinstance(plan, tuple) else plan


def plan_decls(plan) -> list[ModuleDecl]:
    """Every module declaration of a model-wide plan, each once (in layer order)."""
    seen: dict[str, ModuleDecl] = {}
    for p in (plan if isinstance(plan, tuple) else (plan,)):
        for d in p.decls:
            seen.setdefault(d.name, d)
    return list(seen.values())


@dataclass
class LayerGraph:
    """The ops of one layer. `outputs[0]` is the layer output (the next layer's input); every name in
    `outputs` is read by the host or the next layer. `states`: state name -> row width."""

    input: str
    input_width: int
    outputs: tuple[str, ...]
    ops: list[Op]
    states: dict[str, int]
    dtype: str = "bf16"
    weights: str = "bf16"    # "q4": linear layers read the 4-bit row format (docs/quantization.md); "bfp16": at
                             # rest in block float (kernel_builder/block_float.py)
    q4_group: int = 32       # its group size (32: GGUF Q4_0/Q4_1 and RTN; 128: AWQ/GPTQ checkpoints)
    act_formats: dict = field(default_factory=dict)   # activation -> "bfp16": kept in block float in the phase
                             # being lowered (set by `lower` from the rules' ACTIVATION_FORMATS; default bf16)

    def width(self, tensor: str) -> int:
        if tensor == self.input:
            return self.input_width
        for op in self.ops:
            if op.out == tensor:
                return op.width
        raise ValueError(f"tensor {tensor!r} is produced by no op and is not the layer input")

    def act_format(self, tensor) -> str:
        """The element format of an activation in the phase being lowered: "bfp16" (kernel_builder/block_float.py)
        or the graph's dtype."""
        return self.act_formats.get(tensor, self.dtype) if is_activation(tensor) else self.dtype

    def act_arg(self, name: str, rows: int, width: int, role: Role, **kw) -> Arg:
        """The Arg of activation `name` ([rows, width]): in block float, its bytes [rows/8, 9*width] (i8)."""
        if self.act_formats.get(name) == "bfp16":
            return Arg(name, block_float.shape(rows, width), role, "i8", **kw)
        return Arg(name, (rows, width), role, self.dtype, **kw)


ACTIVATION_FORMATS = "activation_formats"   # the rules' key of (ops, phase, graph) -> {activation: format}


# A lowering rule: (op, phase, graph) -> (kernel text factory, wiring in the kernel's canonical order, the
# Args the op adds beyond its activations: weights, state windows, scalars[, launches run before it: (suffix,
# kernel text factory, wiring), e.g. the q4 prefill's weight dequantization]).
Rule = Callable[[Op, Phase, LayerGraph], tuple[Callable[[], str], tuple[str, ...], list[Arg]]]


def lower(graph: LayerGraph, phase: Phase, rules: dict[str, Rule], segments: list[tuple[str, str, list[str]]],
          family: str, host_ops: frozenset[str] = frozenset(),
          presets: dict[str, AirccPreset] | None = None) -> PhasePlan:
    """Cut `graph` into `segments` (segment, module name, op outputs in op order) for `phase`. A segment
    holding only ops in `host_ops` is a host step. Modules share `family` (their statics are one copy per
    bo_key: a layer's weights are resident once for every module); `presets` are keyed by segment."""
    by_out = {op.out: op for op in graph.ops}
    covered = [o for _, _, outs in segments for o in outs]
    if sorted(covered) != sorted(by_out):
        raise ValueError(f"phase {phase.name}: segments cover {covered}, the graph has {list(by_out)}")
    planned = [(seg, name, _fuse([by_out[o] for o in outs], graph, phase, rules)) for seg, name, outs in segments]
    if ACTIVATION_FORMATS in rules:   # which activations this phase keeps in another format (block float)
        graph = replace(graph, act_formats=rules[ACTIVATION_FORMATS]([o for _, _, ops in planned for o in ops],
                                                                     phase, graph))
    producer = {op.out: i for i, (_, _, ops) in enumerate(planned) for op in ops if not op.into}
    consumers: dict[str, set[int]] = {}
    for i, (_, _, ops) in enumerate(planned):
        for op in ops:
            for t in op.ins:
                consumers.setdefault(t, set()).add(i)
    taken: dict[str, tuple[int, str]] = {}       # tensor -> (step, arg) that first took it as an input
    steps: list[Step] = []
    for i, (seg, name, ops) in enumerate(planned):
        kinds = {op.out in host_ops for op in ops}
        if kinds == {True}:
            if len(ops) != 1:
                raise ValueError(f"phase {phase.name}: host segment {seg} must hold one op")
            op = ops[0]
            srcs = {t: _source(t, graph, producer, taken, steps, i) for t in op.ins if is_activation(t)}
            steps.append(Step(None, srcs, host_op=op))
            continue
        if kinds != {False}:
            raise ValueError(f"phase {phase.name}: segment {seg} mixes host and device ops")
        steps.append(_module(i, ops, name, phase, graph, rules, producer, consumers, taken, steps, family,
                             (presets or {}).get(seg)))
    out = graph.outputs[0]
    return PhasePlan(phase, tuple(steps), (producer[out], out))


def _fuse(ops: list[Op], graph: LayerGraph, phase: Phase, rules: dict) -> list[Op]:
    """Epilogue fusion: an op followed in its segment by an op that alone consumes its output (as any of its
    inputs) becomes one op when `rules[(first kind, second kind)](first, second, phase, graph)` returns it (None:
    not in this phase or not this operand; e.g. a decode projection and its bias, or its residual add: one GEMV
    with the bias epilogue)."""
    readers: dict[str, int] = {}
    for op in graph.ops:
        for t in op.ins:
            readers[t] = readers.get(t, 0) + 1
    out: list[Op] = []
    for op in ops:
        prev = out[-1] if out else None
        fuse = rules.get((prev.kind, op.kind)) if prev is not None else None
        if fuse and not prev.into and prev.out in op.ins and readers.get(prev.out) == 1 \
                and prev.out not in graph.outputs:
            fused = fuse(prev, op, phase, graph)
            if fused is not None:
                out[-1] = fused
                # an earlier op whose output only the replaced op read, and the fused op no longer reads
                # (swiglu(gate, up) -> linear_swiglu(x, w_gate, w_up): the gate projection) is dropped
                gone = {t for t in op.ins if is_activation(t) and t != prev.out and readers.get(t) == 1
                        and t not in fused.ins and t not in graph.outputs}
                out = [o for o in out if o.into or o.out not in gone]
                continue
        out.append(op)
    return out


def _source(t: str, graph: LayerGraph, producer: dict, taken: dict, steps: list[Step], here: int) -> Source:
    if t in producer and producer[t] < here:
        s = producer[t]
        return Source(t, s, t, host=steps[s].decl is None)
    if t in producer:
        raise ValueError(f"tensor {t!r} is read by step {here} before step {producer[t]} produces it")
    if t != graph.input:
        raise ValueError(f"tensor {t!r} is produced by no op and is not the layer input")
    if t in taken:
        s, a = taken[t]
        return Source(t, s, a)
    taken[t] = (here, t)
    return Source(t)


def _module(i: int, ops: list, name: str, phase: Phase, graph: LayerGraph, rules: dict, producer: dict,
            consumers: dict, taken: dict, steps: list, family: str, preset: AirccPreset | None) -> Step:
    rows = phase.rows
    args: dict[str, Arg] = {}
    inputs: dict[str, Source] = {}
    launches = []
    local = {op.out for op in ops if not op.into}

    def add(a: Arg) -> None:
        prev = args.setdefault(a.name, a)
        if prev != a:
            raise ValueError(f"module {name}: argument {a.name} declared twice differently ({prev} vs {a})")

    for op in ops:
        for t in op.ins:
            if not is_activation(t) or t in local or t in args:
                continue
            add(graph.act_arg(t, rows, graph.width(t), Role.INPUT))
            inputs[t] = _source(t, graph, producer, taken, steps, i)
        build, wiring, extra, *pre = rules[op.kind](op, phase, graph)
        for a in extra:
            add(a)
        for suffix, pre_build, pre_wiring in (pre[0] if pre else ()):
            launches.append(Launch(f"{op.out}_{suffix}", pre_build, pre_wiring))
        if op.into:
            add(Arg(op.out, (rows, op.width), Role.STATE, graph.dtype, state=op.into, at=POS))
        else:
            later = any(j != i for j in consumers.get(op.out, ())) or op.out in graph.outputs
            add(graph.act_arg(op.out, rows, op.width, Role.OUTPUT if later else Role.INTERMEDIATE))
        launches.append(Launch(op.out, build, wiring))
    scalars = sorted({a.name for a in args.values() if a.role is Role.SCALAR}
                     | {a.at for a in args.values() if a.role is Role.STATE and a.at and isinstance(a.at, str)})
    decl = ModuleDecl(name=name, args=tuple(args.values()), launches=tuple(launches), family=family,
                      scalars=tuple(scalars), preset=preset)
    return Step(decl, inputs)
