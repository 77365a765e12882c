"""mpiredist: memory-efficient redistribution of distributed arrays over MPI.

The package is layered (see ``docs/architecture.md``): ``core`` (meshes,
layouts, block geometry, errors) and ``planning`` (plans, costs, the memory
model, the simulator) need only numpy; ``runtime`` (communicators, agreement,
:class:`Transfer` and its executors) and ``arrays`` (:class:`DistArray`,
ops, FFT, HDF5) need mpi4py, imported when first used.  This module only
re-exports the public names, lazily, so ``import mpiredist`` stays free of
MPI and of planner cost.
"""

import importlib

from .core.errors import (BudgetWarning, CommunicationError, DonationWarning, LayoutError,
                          MeshError, MismatchError, MpiredistError, PlanError, RemoteError, ShapeError)
from .core.layout import Layout
from .core.mesh import Mesh
from .planning.plans import Plan, Step

__version__ = "0.2.0"

__all__ = ["Mesh", "Layout", "Plan", "Step", "plan", "Transfer", "DistArray", "redistribute",
           "matmul", "concatenate",
           "MpiredistError", "LayoutError", "MeshError", "ShapeError", "PlanError",
           "MismatchError", "RemoteError", "CommunicationError", "BudgetWarning",
           "DonationWarning",
           "ops", "heat", "fft", "hdf5"]

# public name -> (module, attribute or None for the module itself)
_LAZY = {
    "plan": (".planning.planner", "plan"),
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
