"""mpiredist: memory-efficient redistribution of distributed arrays over MPI.

The package is layered (see ``docs/architecture.md``): ``core`` (meshes,
layouts, block geometry, errors) and ``planning`` (plans, costs, the memory
model, the simulator) need only numpy and are imported here, so that a
first call does not import them; ``runtime`` (communicators, agreement,
:class:`Transfer`, its steps and the exchange) and ``arrays``
(:class:`DistArray`, ops, FFT, HDF5) need mpi4py, imported with all they
use when one of their names is first looked up (``mr.Transfer``,
``mr.redistribute``...).  ``import mpiredist`` stays free of MPI.
"""

import importlib

from .core.errors import (BudgetWarning, CommunicationError, DonationWarning, LayoutError,
                          MeshError, MismatchError, MpiredistError, PlanError, RemoteError, ShapeError)
from .core.layout import Layout
from .core.mesh import Mesh
from .planning import planner as _planner
from .planning.plans import Plan, Step

__version__ = "0.2.0"

__all__ = ["Mesh", "Layout", "Plan", "Step", "plan", "Transfer", "DistArray", "redistribute",
           "matmul", "concatenate",
           "MpiredistError", "LayoutError", "MeshError", "ShapeError", "PlanError",
           "MismatchError", "RemoteError", "CommunicationError", "BudgetWarning",
           "DonationWarning",
           "ops", "heat", "fft", "hdf5"]

# public name -> (module, attribute or None for the module itself)
plan = _planner.plan

_LAZY = {
    "Transfer": (".runtime.transfer", "Transfer"),
    "DistArray": (".arrays.distarray", "DistArray"),
    "redistribute": (".arrays.base", "redistribute"),
    "matmul": (".arrays.linalg", "matmul"),
    "concatenate": (".arrays.shape", "concatenate"),
    "ops": (".arrays.ops", None),
    "heat": (".arrays.heat", None),
    "fft": (".arrays.fft", None),
    "hdf5": (".arrays.hdf5", None),
}


def __getattr__(name):
    if name not in _LAZY:
        raise AttributeError(f"module 'mpiredist' has no attribute {name!r}")
    module, attr = _LAZY[name]
    found = importlib.import_module(module, __name__)
    return found if attr is None else getattr(found, attr)


def __dir__():
    return sorted(set(globals()) | set(_LAZY))
