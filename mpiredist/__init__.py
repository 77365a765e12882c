"""mpiredist: memory-efficient redistribution of distributed arrays over MPI.

Planning (meshes, layouts, plans, the simulator) needs only numpy; running
plans needs mpi4py, imported when first used.
"""

from .errors import (BudgetWarning, CommunicationError, LayoutError, MeshError, MismatchError,
                     MpiredistError, PlanError, RemoteError, ShapeError)
from .layout import Layout
from .mesh import Mesh
from .plans import Plan, Step

__version__ = "0.1.0"

__all__ = ["Mesh", "Layout", "Plan", "Step", "plan", "DistArray", "redistribute",
           "MpiredistError", "LayoutError", "MeshError", "ShapeError", "PlanError",
           "MismatchError", "RemoteError", "CommunicationError", "BudgetWarning"]


def __getattr__(name):
    # Lazy imports keep ``import mpiredist`` free of MPI and of planner cost.
    if name == "plan":
        from .planner import plan
        return plan
    if name == "DistArray":
        from .distarray import DistArray
        return DistArray
    if name == "redistribute":
        from .distarray import redistribute
        return redistribute
    raise AttributeError(f"module 'mpiredist' has no attribute {name!r}")
