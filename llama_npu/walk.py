"""The one walk of a phase plan through the executor: `run_layers` binds every module input of every layer
where the plan says it comes from (the layer input, another module's output as a ref, or a host step)."""
from __future__ import annotations

import numpy as np

from .models.graph import call_scalars, layer_plan


def layer_key(layer: int) -> str:
    """A layer's buffer-set key: its weights (shared by every module of the layer family) and KV cache."""
    return f"L{layer}"


def run_layers(cache, plans, x: np.ndarray, pos: int, n_layers: int, host_op=None,
               read_hidden: bool = False, read_last: bool = False) -> list[np.ndarray]:
    """Run `n_layers` layers of `plans` (one PhasePlan for every layer, or a tuple of each layer's) on the host
    rows `x` at position `pos`: every module input is bound where the plan says it comes from (layer 0's input:
    `x`; later layers: the previous layer's output; a module output: a ref; a host step:
    `host_op(step, layer, pos, results)`'s array). Returns the layer outputs read back (every layer with
    read_hidden, the last one with read_last)."""
    run, ref = cache.load_and_run, cache.ref
    hidden = []
    out_module = None                    # the module holding the previous layer's output
    for layer in range(n_layers):
        plan = layer_plan(plans, layer)
        out_step, out_arg = plan.output
        host_reads = {i: [src.arg for st in plan.steps if st.decl is None for src in st.inputs.values()
                          if src.step == i] for i in range(len(plan.steps))}
        bo = layer_key(layer)
        host_vals: dict[int, np.ndarray] = {}
        results: dict[int, dict] = {}
        for i, step in enumerate(plan.steps):
            if step.decl is None:
                host_vals[i] = host_op(step, layer, pos, results)
                continue
            args = {}
            for name, src in step.inputs.items():
                if src.step < 0:     # the layer input: the host rows, then the previous layer's output
                    args[name] = x if layer == 0 else ref(out_module, prev_arg)
                elif src.host:
                    args[name] = host_vals[src.step]
                else:
                    args[name] = ref(plan.steps[src.step].decl.name, src.arg)
            wanted = set(host_reads[i])
            if i == out_step and (read_hidden or (read_last and layer == n_layers - 1)):
                wanted.add(out_arg)
            scalars = call_scalars(step.decl, pos)
            results[i] = run(step.decl.name, bo_key=bo, read=wanted, **scalars, **args)
        if out_arg in results.get(out_step, {}):
            hidden.append(results[out_step][out_arg])
        out_module, prev_arg = plan.steps[out_step].decl.name, out_arg
    return hidden
