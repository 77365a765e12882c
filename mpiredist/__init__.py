"""mpiredist: memory-efficient redistribution of distributed arrays over MPI.

The package is layered (see ``docs/architecture.md``): ``core`` (meshes,
layouts, block geometry, errors) and ``planning`` (plans, costs, the memory
model, the simulator) need only numpy; ``runtime`` (communicators,
agreement, :class:`Transfer`, its steps and the exchange) and ``arrays``
(:class:`DistArray`, ops, FFT, HDF5) need mpi4py.  All of them are
imported here, so that a first call (``mr.redistribute(...)`` in a fresh
process) imports nothing inside the memory bound it promises; mpi4py
itself is imported only by the first call that uses MPI (the runtime
imports it inside functions), so ``import mpiredist`` stays free of MPI
and ``python -m mpiredist plan`` runs where mpi4py cannot be imported.
"""

import importlib

from .core.errors import (BudgetWarning, CheckpointError, ClosedError, CommunicationError,
                          DonationWarning, LayoutError, MemoryBudgetError, MeshError,
                          MismatchError, MpiredistError, PlacementError, PlanError, RemoteError,
                          ShapeError)
from .core.layout import Layout
from .core.mesh import Mesh
from .core.topology import Topology
from .planning import planner as _planner
from .planning.plans import Plan, Step

__version__ = "0.2.0"

__all__ = ["Mesh", "Layout", "Topology", "Plan", "Step", "plan", "topology", "Transfer",
           "TransferGroup", "DistArray", "redistribute", "redistribute_many", "redistribute_tree",
           "matmul", "concatenate", "save", "load",
           "MpiredistError", "LayoutError", "MeshError", "ShapeError", "PlanError",
           "PlacementError", "MismatchError", "RemoteError", "CommunicationError", "MemoryBudgetError",
           "ClosedError", "CheckpointError", "BudgetWarning", "DonationWarning",
           "ops", "heat", "fft", "hdf5", "torch", "checkpoint"]

plan = _planner.plan

# public name -> (module, attribute or None for the module itself), imported below
_PUBLIC = {
    "Transfer": (".runtime.transfer", "Transfer"),
    "TransferGroup": (".runtime.group", "TransferGroup"),
    "redistribute_many": (".arrays.many", "redistribute_many"),
    "redistribute_tree": (".arrays.many", "redistribute_tree"),
    "topology": (".runtime.groups", "topology"),
    "DistArray": (".arrays.distarray", "DistArray"),
    "redistribute": (".arrays.base", "redistribute"),
    "matmul": (".arrays.linalg", "matmul"),
    "concatenate": (".arrays.shape", "concatenate"),
    "ops": (".arrays.ops", None),
    "heat": (".arrays.heat", None),
    "torch": (".arrays.dtensor", None),
    "fft": (".arrays.fft", None),
    "hdf5": (".arrays.hdf5", None),
    "save": (".checkpoint.api", "save"),
    "load": (".checkpoint.api", "load"),
    "checkpoint": (".checkpoint", None),
}

# Dynamic imports: these modules import mpi4py only inside the functions that
# use MPI, and import-linter checks that no static import path leads here.
for _name, (_module, _attr) in _PUBLIC.items():
    _found = importlib.import_module(_module, __name__)
    globals()[_name] = _found if _attr is None else getattr(_found, _attr)
del _name, _module, _attr, _found
