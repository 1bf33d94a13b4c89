"""The NPU2 hardware layer: facts (one sourced table), a resource analyzer over module text and a cost model.

Public API (docs/hardware-model.md):
- `NPU2`: the facts object (kernel_builder.hw.facts.NPU2Facts); `NPU2.sources()` gives each figure's source;
- `analyze_module(text, name=None) -> ModuleReport`: per-launch reports, `usage` per tile type, `violations`
  (in the order the real lowering would meet them), `ok`, `first_violation()` (one line), `modeled_ms`;
- `cost`: the cost model module; `cost.PARAMS` is the likely `cost.CostParams` (one frozen dataclass, every
  field with its source and range), `cost.calibrate(points)` refits its FITTED fields from measured points;
  `kernel_builder.hw.scenarios` gives the optimistic / likely / pessimistic parameter sets and
  `kernel_builder.hw.calibration` validates a calibration out of sample.
"""
import importlib

from kernel_builder.hw.facts import NPU2, NPU2Facts

# The facts load with the package (the planners and the kernels' vector multiples read them); the analyzer and
# the cost model load on first use, so reading a figure does not import the module-text reader.
_LAZY = {"cost": "kernel_builder.hw.cost", "LaunchReport": "kernel_builder.hw.results",
         "Usage": "kernel_builder.hw.results", "Violation": "kernel_builder.hw.results",
         "HwParseError": "kernel_builder.hw.ir", "HwCheckError": "kernel_builder.hw.module_report",
         "ModuleReport": "kernel_builder.hw.module_report", "analyze_module": "kernel_builder.hw.module_report",
         "gate": "kernel_builder.hw.module_report", "hw_check_main": "kernel_builder.hw.module_report"}


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module 'kernel_builder.hw' has no attribute {name!r}")
    module = importlib.import_module(_LAZY[name])
    return module if name == "cost" else getattr(module, name)


__all__ = ["NPU2", "NPU2Facts", "analyze_module", "ModuleReport", "LaunchReport", "Usage", "Violation",
           "HwParseError", "HwCheckError", "gate", "hw_check_main", "cost"]
