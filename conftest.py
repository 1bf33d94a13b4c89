# Make the repo root and tests/ importable (tests use the `tooling`, `air_*`, `hw_texts`, `checkpoints` helpers).
import os
import sys

_ROOT = os.path.dirname(os.path.abspath(__file__))
for p in (_ROOT, os.path.join(_ROOT, "tests")):
    if p not in sys.path:
        sys.path.insert(0, p)
