"""Exceptions raised by mpiredist.

Every user error is a subclass of :class:`ValueError` whose message names the
object at fault (layout, mesh axis, shape, rank), what was expected and what
was found.  Failures inside MPI become :class:`CommunicationError`.
"""

__all__ = [
    "MpiredistError",
    "LayoutError",
    "MeshError",
    "ShapeError",
    "PlanError",
    "PlacementError",
    "MismatchError",
    "RemoteError",
    "CommunicationError",
    "MemoryBudgetError",
    "ClosedError",
    "CheckpointError",
    "BudgetWarning",
    "DonationWarning",
    "remote",
]


class MpiredistError(Exception):
    """Base class of every exception raised by mpiredist."""


class LayoutError(MpiredistError, ValueError):
    """A layout is malformed or does not fit the mesh or the array."""


class MeshError(MpiredistError, ValueError):
    """A mesh is malformed or does not match its communicator."""


class ShapeError(MpiredistError, ValueError):
    """A global shape, local block or dtype is not what the layout implies."""


class PlanError(MpiredistError, ValueError):
    """A redistribution that no strategy can express (e.g. creating partials)."""


class PlacementError(PlanError, RuntimeError):
    """A DTensor redistribution that DTensor refuses too (a target that creates
    or moves a Partial, no placements): a :class:`PlanError`, and the
    ``RuntimeError`` that DTensor raises there, so that code written for
    ``DTensor.redistribute`` catches it."""


class MismatchError(MpiredistError, ValueError):
    """Ranks disagree on the arguments of a collective call."""


class RemoteError(MpiredistError, ValueError):
    """Another rank found bad input; raised on the ranks that did not.

    Raised as the subclass that matches the culprit's error (e.g.
    ``RemoteShapeError``, a :class:`ShapeError` too), with the culprit's
    message, so that the same ``except`` clause catches it on every rank;
    ``rank`` is the rank at fault.
    """

    rank = None


class CommunicationError(MpiredistError, RuntimeError):
    """An MPI call failed while a plan step was running."""


class MemoryBudgetError(MpiredistError, MemoryError):
    """A call's memory bound does not fit what a rank can use; raised on every
    rank before any data moves."""


class ClosedError(MpiredistError, ValueError):
    """A Transfer was used after :meth:`~mpiredist.Transfer.free`."""


class CheckpointError(MpiredistError, ValueError):
    """A checkpoint is missing, malformed, corrupt or does not hold what a load
    asks for; or saving one failed.  The message names the array and the file."""


class RemoteLayoutError(RemoteError, LayoutError):
    """A :class:`LayoutError` found on another rank."""


class RemoteMeshError(RemoteError, MeshError):
    """A :class:`MeshError` found on another rank."""


class RemoteShapeError(RemoteError, ShapeError):
    """A :class:`ShapeError` found on another rank."""


class RemotePlanError(RemoteError, PlanError):
    """A :class:`PlanError` found on another rank."""


class RemotePlacementError(RemoteError, PlacementError):
    """A :class:`PlacementError` found on another rank."""


class RemoteMismatchError(RemoteError, MismatchError):
    """A :class:`MismatchError` found on another rank."""


class RemoteMemoryBudgetError(RemoteError, MemoryBudgetError):
    """A :class:`MemoryBudgetError` found on another rank."""


class RemoteClosedError(RemoteError, ClosedError):
    """A :class:`ClosedError` found on another rank."""


class RemoteCheckpointError(RemoteError, CheckpointError):
    """A :class:`CheckpointError` found on another rank."""


_REMOTE = {"LayoutError": RemoteLayoutError, "MeshError": RemoteMeshError,
           "ShapeError": RemoteShapeError, "PlanError": RemotePlanError,
           "PlacementError": RemotePlacementError,
           "MismatchError": RemoteMismatchError, "MemoryBudgetError": RemoteMemoryBudgetError,
           "ClosedError": RemoteClosedError, "CheckpointError": RemoteCheckpointError}


def remote(name, message, rank):
    """The exception to raise where rank ``rank`` raised ``name(message)``.

    Errors of this package keep their class (as its remote subclass); any
    other becomes a plain :class:`RemoteError` whose message names it.
    """
    cls = _REMOTE.get(name)
    error = cls(message) if cls is not None else RemoteError(f"rank {rank}: {name}: {message}")
    error.rank = rank
    return error


class BudgetWarning(ResourceWarning):
    """A redistribution will allocate more than its workspace budget allows."""


class DonationWarning(BudgetWarning):
    """A donated block could not be reused on some rank; the call copied instead.

    Every rank then runs as if not donated (the source is left as it was),
    so the donated memory bound does not apply to that call.
    """
