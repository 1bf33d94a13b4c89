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
from kernel_builder.hw import cost
from kernel_builder.hw.results import LaunchReport, Usage, Violation
from kernel_builder.hw.facts import NPU2, NPU2Facts
from kernel_builder.hw.ir import HwParseError
from kernel_builder.hw.report import HwCheckError, ModuleReport, analyze_module, gate, hw_check_main

__all__ = ["NPU2", "NPU2Facts", "analyze_module", "ModuleReport", "LaunchReport", "Usage", "Violation",
           "HwParseError", "HwCheckError", "gate", "hw_check_main", "cost"]
