"""Benchmark of redistribution strategies: shared cases, XLA's plans, the plan-only table.

The names below are the bench's public surface (the CLI's ``model`` command
uses them); each is imported from its submodule when first used, so
``import mpiredist.bench`` stays cheap and free of MPI.  The time model is
:mod:`mpiredist.planning.model`.
"""

import importlib

__all__ = ["Case", "get_case", "load_cases", "STRATEGIES", "plan_only_table", "format_table"]

# public name -> submodule that defines it
_LAZY = {
    "Case": ".cases",
    "get_case": ".cases",
    "load_cases": ".cases",
    "STRATEGIES": ".tables",
    "plan_only_table": ".tables",
    "format_table": ".tables",
}


def __getattr__(name):
    if name not in _LAZY:
        raise AttributeError(f"module 'mpiredist.bench' has no attribute {name!r}")
    return getattr(importlib.import_module(_LAZY[name], __name__), name)


def __dir__():
    return sorted(set(globals()) | set(_LAZY))
