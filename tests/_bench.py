"""The benchmark scripts (``benchmarks/*.py``), which are not a package, loaded as modules so the
tests can call their functions: one loader, registered in ``sys.modules`` (dataclasses look
their module up there)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent


def benchmark(relpath: str, name: str) -> ModuleType:
    """``benchmark("search.py", "search_bench")``: ``benchmarks/<relpath>`` as module ``name``."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / relpath)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod
